"""`ValkaBackend` in this process: validation before anything is sent, the system checks, the
in-process mode of Valka's own project (its enqueue in the caller's transaction), a remote
server that cannot be reached, `get_result`'s reading of every status and of the runs, and the
async calls. The whole path over REST and gRPC: tests/e2e/test_django_tasks.py."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta
from datetime import timezone as timezone_of

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.utils import timezone

from tasks.models import Task
from tests.factories import TaskFactory, TaskRunFactory
from tests.sdk import django_tasks
from valka.devdb import free_port
from valka_sdk.django import ValkaBackend, ValkaTask
from valka_sdk.errors import RunFailed, RunLost, ValkaUnavailable, format_failure

DOWN = f"http://127.0.0.1:{free_port()}"  # nothing listens there


@pytest.fixture
def backends(settings):
    settings.TASKS = {
        **settings.TASKS,  # "default": Valka's own, in process, any queue
        "checked": {"BACKEND": "valka_sdk.django.ValkaBackend", "QUEUES": ["default", "emails"]},
        "remote": {"BACKEND": "valka_sdk.django.ValkaBackend", "QUEUES": ["emails"],
                   "OPTIONS": {"URL": DOWN, "RETRIES": 2, "TIMEOUT": 1}},
    }
    return task_backends


def receipt(**options):
    return django_tasks.send_receipt.using(**options)


def test_the_backend_says_what_it_supports(backends):
    backend = backends["default"]
    assert isinstance(backend, ValkaBackend)
    assert backend.supports_defer and backend.supports_async_task and backend.supports_get_result
    assert backend.supports_priority and backend.check() == []


@pytest.mark.django_db(transaction=True)
def test_in_project_enqueue_follows_the_callers_transaction(backends):
    task = django_tasks.send_receipt
    assert isinstance(task, ValkaTask)
    with transaction.atomic():
        kept = task.using(idempotency_key="receipt-1").enqueue(41)
    assert kept.status == TaskResultStatus.READY and kept.enqueued_at is not None
    row = Task.objects.get(id=kept.id)
    assert (row.task_name, row.queue, row.priority, row.max_retries, row.timeout_seconds, row.metadata,
            row.idempotency_key, row.input) == ("tests.sdk.django_tasks.send_receipt", "emails", 7, 1, 30, {"m": 1},
                                                "receipt-1", {"args": [41], "kwargs": {}})
    with pytest.raises(RuntimeError), transaction.atomic():
        dropped = task.enqueue(42)
        raise RuntimeError("roll back")
    assert not Task.objects.filter(id=dropped.id).exists()
    again = task.using(idempotency_key="receipt-1").enqueue(43)
    assert again.id == kept.id, "an idempotency key that exists answers its task"
    read = task.get_result(kept.id)
    assert (read.status, read.args, read.task.queue_name, read.task.priority) == ("READY", [41], "emails", 7)
    with pytest.raises(TaskResultDoesNotExist):
        task.get_result(str(dropped.id))
    with pytest.raises(TaskResultDoesNotExist):
        task.get_result("not an id")
    later = task.using(run_after=datetime.now(UTC) + timedelta(hours=1)).enqueue(1)
    assert task.get_result(later.id).task.run_after is not None


@pytest.mark.parametrize(("options", "args", "problem"), [
    ({"queue_name": "nope"}, (1,), "Queue 'nope' is not valid"),
    ({"priority": 101}, (1,), "priority must be"),
    ({"run_after": datetime(2030, 1, 1)}, (1,), "run_after must be an aware datetime"),
    ({"run_after": datetime(1, 1, 1, tzinfo=timezone_of(timedelta(hours=5)))}, (1,), "run_after must fall within"),
    ({"max_retries": -1}, (1,), "max_retries must be"),
    ({"timeout_seconds": 0}, (1,), "timeout_seconds must be"),
    ({"idempotency_key": ""}, (1,), "idempotency_key must be"),
    ({"metadata": {"x": object()}}, (1,), "metadata must be JSON"),
    ({}, ({1, 2},), "arguments must be JSON"),
    ({}, (math.nan,), "args must be JSON"),
])
@pytest.mark.django_db(transaction=True)
def test_bad_input_is_refused_before_anything_is_sent(backends, options, args, problem):
    with pytest.raises(InvalidTask, match=problem):
        receipt(backend="checked", **options).enqueue(*args)
    assert Task.objects.count() == 0


def test_an_unreachable_server_raises_naming_its_url_and_on_commit_follows_django(backends):
    task = receipt(backend="remote")
    with pytest.raises(ValkaUnavailable, match=f"at {DOWN} is unreachable"):
        task.enqueue(1)


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_the_send_waits_for_the_commit(backends, settings):
    task = receipt(backend="remote")
    with pytest.raises(ValkaUnavailable), transaction.atomic():
        result = task.enqueue(1)
        assert result.status == TaskResultStatus.READY and result.id and result.enqueued_at is None
    with pytest.raises(RuntimeError), transaction.atomic():
        task.enqueue(2)
        raise RuntimeError("roll back: nothing is sent, nothing raised about sending")
    settings.TASKS = {"remote": {**settings.TASKS["remote"], "OPTIONS": {
        **settings.TASKS["remote"]["OPTIONS"], "ON_COMMIT_ROBUST": True}}}
    with transaction.atomic():  # robust: the failed send is logged by Django, not raised
        receipt(backend="remote").enqueue(3)


def test_system_checks_name_what_is_wrong(settings):
    settings.TASKS = {"x": {"BACKEND": "valka_sdk.django.ValkaBackend", "QUEUES": ["bad queue"],
                            "OPTIONS": {"URL": "ftp://x", "TYPO": 1, "TLS_CERT_FILE": "/nope"}}}
    ids = {message.id for message in task_backends["x"].check()}
    assert ids == {"valka_sdk.E001", "valka_sdk.E003", "valka_sdk.E005", "valka_sdk.E006", "valka_sdk.E007"}
    settings.TASKS = {"x": {"BACKEND": "valka_sdk.django.ValkaBackend", "QUEUES": ["emails"],
                            "OPTIONS": {"URL": "https://valka.example.com"}}}
    assert [m.id for m in task_backends["x"].check()] == ["valka_sdk.E004"], "an API key off loopback"
    with pytest.raises(ImproperlyConfigured, match="API_KEY"):
        receipt(backend="x").enqueue(1)


@pytest.mark.parametrize(("valka", "django"), [
    ("PENDING", "READY"), ("DISPATCHING", "READY"), ("RETRY", "READY"), ("RUNNING", "RUNNING"),
    ("COMPLETED", "SUCCESSFUL"), ("FAILED", "FAILED"), ("DEAD_LETTER", "FAILED"), ("CANCELLED", "FAILED"),
])
@pytest.mark.django_db(transaction=True)
def test_get_result_maps_every_valka_status(backends, valka, django):
    row = TaskFactory(task_name="tests.sdk.django_tasks.send_receipt", queue="emails", priority=7, status=valka,
                      input={"args": [5], "kwargs": {"copy": True}},
                      output={"sent": 5} if valka == "COMPLETED" else None)
    result = django_tasks.send_receipt.get_result(str(row.id))
    assert (result.status, result.args, result.kwargs, result.task.queue_name) == (django, [5], {"copy": True},
                                                                                   "emails")
    assert result.is_finished == (django in ("SUCCESSFUL", "FAILED"))
    if valka == "COMPLETED":
        assert result.return_value == {"sent": 5}
    else:
        with pytest.raises(ValueError):
            result.return_value  # noqa: B018 (Django's property raises until SUCCESSFUL)


@pytest.mark.django_db(transaction=True)
def test_get_result_reads_each_run_as_an_error_a_worker_and_a_time(backends):
    try:
        raise ConnectionError("the mail server hung up")
    except ConnectionError as exc:
        sent = format_failure("ConnectionError: the mail server hung up", exc)
    row = TaskFactory(task_name="tests.sdk.django_tasks.send_receipt", queue="emails", priority=7,
                      status="DEAD_LETTER", attempt_count=3, input={"args": [5], "kwargs": {}})
    start = timezone.now() - timedelta(minutes=5)
    runs = [TaskRunFactory(task=row, attempt_number=n, worker_id=f"w{n}", status=status, error_message=message,
                           started_at=start + timedelta(minutes=n), finished_at=start + timedelta(minutes=n, seconds=9))
            for n, status, message in ((1, "FAILED", sent), (2, "LOST", "lease expired"),
                                       (3, "FAILED", "output too large"))]
    result = django_tasks.send_receipt.get_result(str(row.id))
    assert (result.status, result.worker_ids, result.attempts) == ("FAILED", ["w1", "w2", "w3"], 3)
    assert [(e.exception_class_path, e.exception_class) for e in result.errors] == [
        ("builtins.ConnectionError", ConnectionError), ("valka_sdk.errors.RunLost", RunLost),
        ("valka_sdk.errors.RunFailed", RunFailed)]
    assert result.errors[0].traceback.startswith("Traceback (most recent call last):")
    assert result.errors[0].traceback.rstrip().endswith("ConnectionError: the mail server hung up")
    assert [e.traceback for e in result.errors[1:]] == ["lease expired", "output too large"]
    row.refresh_from_db()
    assert (result.enqueued_at, result.started_at, result.last_attempted_at, result.finished_at) == (
        row.created_at, runs[0].started_at, runs[2].started_at, row.finished_at)


@pytest.mark.django_db(transaction=True)
def test_aenqueue_and_aget_result(backends):
    async def enqueue_and_read():
        sent = await django_tasks.async_receipt.aenqueue(9)
        return sent, await django_tasks.async_receipt.aget_result(sent.id)

    sent, read = asyncio.run(enqueue_and_read())
    assert sent.status == TaskResultStatus.READY and sent.enqueued_at is not None
    assert (read.id, read.status, read.args) == (sent.id, TaskResultStatus.READY, [9])
    assert Task.objects.get(id=sent.id).task_name == "tests.sdk.django_tasks.async_receipt"
    with pytest.raises(TaskResultMismatch):
        asyncio.run(django_tasks.send_receipt.aget_result(sent.id))
