"""Behaviour that needs real commits: concurrent idempotent creates and NOTIFY delivery."""

import threading

import psycopg
import pytest
from django.db import connection
from rest_framework.test import APIClient

from tasks import services
from tasks.models import DeadLetter, Task
from tests.factories import TaskFactory
from tests.helpers import database_url
from valka_sdk.ids import uuid7

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("name", ["idempotency_key", "id"])
def test_idempotency_under_concurrent_requests(api_key, name):
    """Many requests race with one key, or one id the client made: one task exists, everyone
    gets its id, one got 201."""
    value = "invoice-42" if name == "idempotency_key" else str(uuid7())
    results, errors = [], []
    barrier = threading.Barrier(12)

    def send():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key}")
        barrier.wait()
        try:
            r = client.post("/api/v1/tasks", {"task_name": "charge", "queue": "billing", name: value},
                            format="json")
            results.append((r.status_code, r.json()["id"]))
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(results) == 12
    assert len({task_id for _, task_id in results}) == 1
    assert sorted(code for code, _ in results) == [200] * 11 + [201]
    assert Task.objects.filter(**{name: value}).count() == 1


def _listen(channel):
    conn = psycopg.connect(database_url(), autocommit=True)
    conn.execute(f"LISTEN {channel}")
    return conn


def _drain(conn, timeout=10.0):
    return [(n.channel, n.payload) for n in conn.notifies(timeout=timeout, stop_after=1)]


def test_create_notifies_with_the_queue_and_the_task():
    listener = _listen("valka_task_ready")
    try:
        task = services.task_enqueue(task_name="t", queue="fast-lane")
        assert _drain(listener) == [("valka_task_ready", f"fast-lane {task.id}")]
    finally:
        listener.close()


def test_future_task_does_not_notify_and_rollback_sends_nothing():
    from datetime import UTC, datetime, timedelta

    from django.db import transaction

    listener = _listen("valka_task_ready")
    try:
        services.task_enqueue(task_name="t", queue="later", run_at=datetime.now(UTC) + timedelta(hours=1))
        with pytest.raises(RuntimeError), transaction.atomic():
            services.task_enqueue(task_name="t", queue="rolled-back")
            raise RuntimeError("the caller's transaction fails")
        assert _drain(listener, timeout=0.5) == []
        assert not Task.objects.filter(queue="rolled-back").exists()
    finally:
        listener.close()


def test_enqueue_commits_with_the_callers_transaction():
    from django.db import transaction

    listener = _listen("valka_task_ready")
    try:
        with transaction.atomic():
            task = services.task_enqueue(task_name="t", queue="atomic")
            assert _drain(listener, timeout=0.3) == [], "nothing is announced before commit"
        assert _drain(listener) == [("valka_task_ready", f"atomic {task.id}")]
        assert Task.objects.filter(id=task.id).exists()
    finally:
        listener.close()


def test_cancel_notifies_the_dispatchers():
    task = TaskFactory(status="RUNNING")
    listener = _listen("valka_task_cancelled")
    try:
        services.task_cancel(task_id=task.id)
        assert _drain(listener) == [("valka_task_cancelled", str(task.id))]
    finally:
        listener.close()


def test_dead_lettering_writes_the_row_in_the_same_statement():
    exhausted = TaskFactory(status="RETRY", attempt_count=4, max_retries=3, error_message="boom")
    still_has_retries = TaskFactory(status="RETRY", attempt_count=2, max_retries=3)
    moved = services.dead_letter_tasks(task_ids=[exhausted.id, still_has_retries.id])
    assert moved == [exhausted.id]
    letter = DeadLetter.objects.get(task_id=exhausted.id)
    assert (letter.task_name, letter.queue, letter.error_message, letter.attempt_count) == (
        exhausted.task_name, exhausted.queue, "boom", 4)
    exhausted.refresh_from_db()
    still_has_retries.refresh_from_db()
    assert exhausted.status == "DEAD_LETTER" and still_has_retries.status == "RETRY"
    # A second call finds nothing to move and writes no second row.
    assert services.dead_letter_tasks(task_ids=[exhausted.id]) == []
    assert DeadLetter.objects.filter(task_id=exhausted.id).count() == 1
