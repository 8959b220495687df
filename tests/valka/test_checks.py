"""Valka's `check --deploy` warnings (valka/checks.py): in production settings, a dispatcher that takes
workers without a credential, a worker port without TLS, and anonymous API calls each warn, naming the
setting that fixes it; each goes away once fixed, and none shows outside production."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.checks import Tags, run_checks
from django.test import override_settings

from valka import checks

SECURE = {"WORKER_TOKEN": "a-worker-token", "GRPC_TLS_CERT": "/etc/valka/tls/dispatcher.crt",
          "GRPC_TLS_KEY": "/etc/valka/tls/dispatcher.key", "GRPC_TLS_CLIENT_CA": "", "API_ANONYMOUS": False}
OPEN = {"WORKER_TOKEN": "", "GRPC_TLS_CERT": "", "GRPC_TLS_KEY": "", "GRPC_TLS_CLIENT_CA": "", "API_ANONYMOUS": True}


def valka_warnings(production: bool = True, deploy: bool = True, **values) -> dict[str, str]:
    with override_settings(PRODUCTION=production, VALKA={**settings.VALKA, **values}):
        found = run_checks(include_deployment_checks=deploy, tags=[Tags.security])
    return {m.id: f"{m.msg} {m.hint}" for m in found if m.id and m.id.startswith("valka.")}


def test_an_open_production_install_gets_the_three_warnings():
    found = valka_warnings(**OPEN)
    assert set(found) == {"valka.W001", "valka.W002", "valka.W003"}
    assert "VALKA_WORKER_TOKEN" in found["valka.W001"] and "VALKA_GRPC_TLS_CLIENT_CA" in found["valka.W001"]
    assert "VALKA_GRPC_TLS_CERT" in found["valka.W002"] and "VALKA_GRPC_TLS_KEY" in found["valka.W002"]
    assert "VALKA_API_ANONYMOUS" in found["valka.W003"]


def test_a_secured_install_passes():
    assert valka_warnings(**SECURE) == {}
    # Mutual TLS is a worker credential of its own: no token needed.
    assert valka_warnings(**{**SECURE, "WORKER_TOKEN": "", "GRPC_TLS_CLIENT_CA": "/etc/valka/tls/ca.crt"}) == {}


@pytest.mark.parametrize("change, warning", [
    ({"WORKER_TOKEN": ""}, "valka.W001"),
    ({"GRPC_TLS_CERT": "", "GRPC_TLS_KEY": ""}, "valka.W002"),
    ({"GRPC_TLS_KEY": ""}, "valka.W002"),
    ({"API_ANONYMOUS": True}, "valka.W003"),
])
def test_each_weakening_warns_alone(change, warning):
    assert set(valka_warnings(**{**SECURE, **change})) == {warning}


def test_only_in_production_and_only_with_deploy():
    assert valka_warnings(production=False, **OPEN) == {}
    assert valka_warnings(deploy=False, **OPEN) == {}


def test_registered_by_the_tasks_app():
    from django.core.checks.registry import registry

    deploy = registry.get_checks(include_deployment_checks=True)
    for check in (checks.check_worker_credential, checks.check_worker_port_encrypted,
                  checks.check_api_not_anonymous):
        assert check in deploy and check not in registry.get_checks()


def test_the_local_stack_which_would_fail_them_listens_on_loopback_only():
    """`make run` allows anonymous API calls and workers without a credential: its web app and its
    dispatcher listen on 127.0.0.1, on VALKA_GRPC_ADDR's port when the shell set one."""
    from valka import devstack

    assert devstack.LOCAL_ENV["VALKA_API_ANONYMOUS"] == "true" and devstack.WEB_ADDR[0] == "127.0.0.1"
    assert devstack.grpc_port({}) == 50051
    assert devstack.grpc_port({"VALKA_GRPC_ADDR": "0.0.0.0:6000"}) == 6000
    assert devstack.grpc_port({"VALKA_GRPC_ADDR": "[::]:6001"}) == 6001
    procs = devstack._processes("python", devstack.grpc_port({"VALKA_GRPC_ADDR": "0.0.0.0:6000"}))
    assert procs["web"][procs["web"].index("--host") + 1] == "127.0.0.1"
    assert procs["dispatcher"][-2:] == ["--addr", "127.0.0.1:6000"]
