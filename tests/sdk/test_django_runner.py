"""`manage.py valka_worker`'s parts in this process: the worker it builds from `--backend` and
`--queue`, and the command's errors. The whole worker over gRPC: tests/e2e/test_django_tasks.py."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from valka_sdk.django.management.commands import valka_worker
from valka_sdk.django.runner import build_worker


@pytest.fixture
def backends(settings):
    settings.TASKS = {
        **settings.TASKS,
        "checked": {"BACKEND": "valka_sdk.django.ValkaBackend", "QUEUES": ["emails", "default"],
                    "OPTIONS": {"URL": "http://127.0.0.1:1", "DISPATCHER": "127.0.0.1:2", "WORKER_TOKEN": "t"}},
        "no-dispatcher": {"BACKEND": "valka_sdk.django.ValkaBackend", "OPTIONS": {"URL": "http://127.0.0.1:1"}},
        "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
    }


def test_the_worker_takes_its_backends_queues_and_options(backends):
    worker = build_worker(backend_alias="checked", concurrency=3, name="mailer")
    assert (worker.queues, worker.servers, worker.token, worker.concurrency, worker.name) == (
        ["default", "emails"], ["127.0.0.1:2"], "t", 3, "mailer")
    assert build_worker(backend_alias="checked", queues=["emails"], dispatcher="127.0.0.1:3").queues == ["emails"]


@pytest.mark.parametrize(("backend", "problem"), [
    ("nope", "no task backend 'nope'"),
    ("immediate", "is a ImmediateBackend, not a ValkaBackend"),
    ("no-dispatcher", "no dispatcher: set TASKS\\['no-dispatcher'\\]\\['OPTIONS'\\]\\['DISPATCHER'\\]"),
])
def test_the_command_says_what_is_wrong_with_its_backend(backends, backend, problem):
    with pytest.raises(CommandError, match=problem):
        call_command(valka_worker.Command(), "--backend", backend)  # the app is not in Valka's own settings
