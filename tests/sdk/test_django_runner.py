"""`manage.py valka_worker`'s parts in this process: the worker it builds from `--backend` and
`--queue`, the command's errors, and a sync `@task`'s database connections, which the resolver
closes before and after the call as Django's request cycle does. The whole worker over gRPC:
tests/e2e/test_django_tasks.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from valka_sdk.context import TaskContext
from valka_sdk.django.management.commands import valka_worker
from valka_sdk.django.runner import DjangoTasks, build_worker
from valka_sdk.v1 import worker_pb2 as pb


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


def _context(task_name: str, *args) -> TaskContext:
    assignment = pb.TaskAssignment(task_id=str(uuid.uuid4()), task_run_id=str(uuid.uuid4()), queue_name="default",
                                   task_name=task_name, input=json.dumps({"args": list(args), "kwargs": {}}),
                                   attempt_number=1, timeout_seconds=30)
    return TaskContext(assignment, emit_log=lambda entry: None, loop=asyncio.new_event_loop(),
                       ack_signal=lambda signal_id: None)


@pytest.mark.django_db(transaction=True)
def test_sync_tasks_close_their_connections_before_and_after(backends):
    """CONN_MAX_AGE is 0 here, as by default: a connection left open before the run is closed
    before the function starts, and the one the function opened is closed once it returns."""
    handler = DjangoTasks("default", lambda: "worker-1")("tests.sdk.django_tasks.count_tasks")
    ctx = _context("tests.sdk.django_tasks.count_tasks")

    def in_a_worker_thread():
        connection.ensure_connection()
        left_open = connection.connection is not None
        value = handler(ctx)
        return left_open, value, connection.connection is None

    with ThreadPoolExecutor(1) as pool:
        left_open, value, closed_after = pool.submit(in_a_worker_thread).result(30)
    ctx._loop.close()
    assert left_open and value == {"open_at_start": False, "tasks": 0}
    assert closed_after, "the connection the task opened is closed after it"
