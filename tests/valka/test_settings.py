"""Production settings: `check --deploy` passes with the environment the README documents, the
defaults are HTTPS-only as soon as a process has its own SECRET_KEY, and the local stack keeps
plain HTTP."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest
from django.test import Client

from tests.helpers import ROOT

SETTINGS = ["SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD",
            "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "DEBUG", "SECRET_KEY", "ALLOWED_HOSTS"]
INHERITED = [*SETTINGS, "VALKA_API_ANONYMOUS", "VALKA_BEHIND_TLS_PROXY", "DATABASE_URL", "CSRF_TRUSTED_ORIGINS",
             "VALKA_WORKER_TOKEN", "VALKA_GRPC_TLS_CERT", "VALKA_GRPC_TLS_KEY", "VALKA_GRPC_TLS_CLIENT_CA"]


def production_env(**extra: str) -> dict[str, str]:
    """The README's production environment (section "Production"), nothing inherited that could mask it."""
    env = {k: v for k, v in os.environ.items() if k not in INHERITED}
    env.update(SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="valka.example.com",
               DATABASE_URL="postgres://valka:db-password@db.example.com:5432/valka",
               CSRF_TRUSTED_ORIGINS="https://valka.example.com", VALKA_BEHIND_TLS_PROXY="true",
               VALKA_WORKER_TOKEN=secrets.token_urlsafe(32), VALKA_GRPC_TLS_CERT="/etc/valka/tls/dispatcher.crt",
               VALKA_GRPC_TLS_KEY="/etc/valka/tls/dispatcher.key")
    env.update(extra)
    return env


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def settings_in(env: dict[str, str]) -> dict:
    code = ("import json, django; django.setup(); from django.conf import settings as s; "
            f"print(json.dumps({{k: getattr(s, k, None) for k in {SETTINGS!r}}}, default=str))")
    env = {**env, "DJANGO_SETTINGS_MODULE": "valka.settings"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                         check=True)
    return json.loads(out.stdout)


def test_check_deploy_passes_with_the_documented_environment():
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=production_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout + result.stderr


@pytest.mark.parametrize("change, warning", [
    ({"SECRET_KEY": ""}, "security.W009"),
    ({"SECRET_KEY": "short"}, "security.W009"),
    ({"DEBUG": "true"}, "security.W018"),
    ({"SECURE_SSL_REDIRECT": "false"}, "security.W008"),
    ({"SECURE_HSTS_SECONDS": "0"}, "security.W004"),
    ({"SESSION_COOKIE_SECURE": "false"}, "security.W012"),
])
def test_check_deploy_catches_each_weakening(change, warning):
    env = production_env(**change)
    if change.get("SECRET_KEY") == "":
        del env["SECRET_KEY"]
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode != 0 and warning in result.stderr, result.stderr


def test_production_defaults_are_https_only():
    values = settings_in(production_env())
    assert values["DEBUG"] is False
    assert values["SECURE_SSL_REDIRECT"] is True and values["SECURE_HSTS_SECONDS"] >= 31536000
    assert values["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True and values["SECURE_HSTS_PRELOAD"] is True
    assert values["SESSION_COOKIE_SECURE"] is True and values["CSRF_COOKIE_SECURE"] is True
    assert values["ALLOWED_HOSTS"] == ["valka.example.com"]
    # Each can still be set from the environment.
    relaxed = settings_in(production_env(SECURE_SSL_REDIRECT="false", SECURE_HSTS_SECONDS="60",
                                         SECURE_HSTS_PRELOAD="false"))
    assert (relaxed["SECURE_SSL_REDIRECT"], relaxed["SECURE_HSTS_SECONDS"], relaxed["SECURE_HSTS_PRELOAD"]) == (
        False, 60, False)


def test_without_a_secret_key_the_settings_are_the_local_ones():
    env = production_env()
    del env["SECRET_KEY"]
    values = settings_in(env)
    assert values["SECRET_KEY"].startswith("django-insecure-")
    assert values["SECURE_SSL_REDIRECT"] is False and values["SECURE_HSTS_SECONDS"] == 0
    assert values["DEBUG"] is False and values["SESSION_COOKIE_SECURE"] is True


def test_make_run_serves_plain_http_even_with_a_secret_key_exported():
    # valka.devstack's environment on top of a shell that exported SECRET_KEY.
    from valka.devstack import LOCAL_ENV

    env = production_env()
    for name, value in LOCAL_ENV.items():
        env.setdefault(name, value)
    values = settings_in(env)
    assert values["SECURE_SSL_REDIRECT"] is False and values["SECURE_HSTS_SECONDS"] == 0
    assert values["SESSION_COOKIE_SECURE"] is False and values["CSRF_COOKIE_SECURE"] is False


@pytest.mark.django_db
def test_https_redirect_hsts_and_the_plain_http_probes(settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 31536000
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SECURE_HSTS_PRELOAD = True
    client = Client()
    r = client.get("/api/v1/tasks")
    assert r.status_code == 301 and r.headers["Location"] == "https://testserver/api/v1/tasks"
    assert client.get("/admin/").status_code == 301
    # Load balancers and Prometheus speak plain HTTP inside the network.
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 200
    secure = client.get("/api/v1/tasks", secure=True)
    assert secure.status_code == 401
    assert secure.headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    assert secure.headers["X-Content-Type-Options"] == "nosniff"
    assert secure.headers["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize("command", ["run_dispatcher", "run_scheduler"])
def test_a_server_without_a_secret_key_refuses_to_start(command):
    """With DEBUG off and no SECRET_KEY, a dispatcher or scheduler would run on the public development
    key: it refuses, in one line, unless the process says it belongs to a local stack."""
    env = {k: v for k, v in os.environ.items() if k not in (*INHERITED, "VALKA_DEVELOPMENT")}
    env.update(DATABASE_URL=os.environ.get("DATABASE_URL", "postgres://valka@127.0.0.1:1/valka"))
    result = manage(command, env=env)
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert lines == [f"CommandError: {command}: SECRET_KEY is not set: set it (and ALLOWED_HOSTS) to run in "
                     "production, or VALKA_DEVELOPMENT=true for a local stack"]


@pytest.mark.parametrize("entry", ["valka.asgi", "valka.wsgi"])
def test_the_web_app_without_a_secret_key_refuses_to_start(entry):
    env = {k: v for k, v in os.environ.items() if k not in (*INHERITED, "VALKA_DEVELOPMENT")}
    result = subprocess.run([sys.executable, "-c", f"import {entry}"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == ("web: SECRET_KEY is not set: set it (and ALLOWED_HOSTS) to run in production, "
                                     "or VALKA_DEVELOPMENT=true for a local stack")


def test_the_development_key_is_refused_only_outside_a_local_stack(settings):
    from valka.conf import refuse_development_key

    settings.DEBUG, settings.PRODUCTION = False, False
    settings.VALKA = {**settings.VALKA, "DEVELOPMENT": False}
    assert "SECRET_KEY is not set" in refuse_development_key("web")
    settings.VALKA = {**settings.VALKA, "DEVELOPMENT": True}
    assert refuse_development_key("web") is None
    settings.VALKA, settings.PRODUCTION = {**settings.VALKA, "DEVELOPMENT": False}, True
    assert refuse_development_key("web") is None
