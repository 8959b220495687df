"""Queries never interpolate input into SQL: hostile text goes through every raw-SQL module
(tasks.sql.producer, lifecycle, outcomes, maintenance; dispatcher.sql; signals.sql) by their real
entry points, comes back byte for byte, and leaves every table as it was.

Queue names are held to a safe charset by the API; the statements that take a queue are still
run here with hostile ones, as rows written by other means could carry them.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from rest_framework.test import APIClient

from dispatcher import sql as dispatcher_sql
from signals.models import Signal
from signals.services import signal_send
from tasks import services
from tasks.errors import ValidationError
from tasks.models import DeadLetter, Task, TaskRun, Worker
from tasks.scheduler.janitor import WorkerJanitor
from tasks.scheduler.promoter import DelayedPromoter
from tasks.scheduler.reaper import LeaseReaper
from tasks.scheduler.retention import Retention
from tasks.scheduler.retry import RetryEngine
from tests.factories import TaskFactory, TaskRunFactory, WorkerFactory
from tests.helpers import Listener, Raw, db_now, hello, make_config, once, wait_status
from valka_sdk.v1 import worker_pb2 as pb

HOSTILE = [
    "x'; DROP TABLE tasks; --",
    "'); DELETE FROM signals; --",
    "\" OR 1=1 --",
    "$$",
    "$q$ SELECT pg_sleep(10) $q$",
    "%(id)s",
    "%s",
    "%%",
    "{}",
    "{0}",
    "\\",
    "\\'",
    "E'\\x41'",
    "; NOTIFY valka_task_ready, 'x'",
    "Ω≈ç√ 🚀 日本",
    "tab\tnew\nline",
]
TABLES = ["tasks", "task_runs", "task_logs", "signals", "dead_letter_queue", "workers", "api_keys"]


def tables_intact() -> None:
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute("SELECT to_regclass(%s)", [table])
            assert cursor.fetchone()[0] is not None, f"table {table} is gone"


@pytest.mark.django_db
def test_hostile_text_round_trips_through_the_services_and_the_api(settings):
    created = {}
    for text in HOSTILE:
        task = services.task_enqueue(task_name=text, queue="q", idempotency_key=text, input={text: [text]},
                                     metadata={"m": text})
        created[text] = task.id
        # The same key finds the same task (SELECT_BY_IDEMPOTENCY_KEY).
        assert services.task_enqueue(task_name="other", queue="q", idempotency_key=text).id == task.id
    for text, task_id in created.items():
        row = Task.objects.get(id=task_id)
        assert (row.task_name, row.idempotency_key, row.input, row.metadata) == (text, text, {text: [text]},
                                                                                 {"m": text})
        signal, _ = signal_send(task_id=task_id, signal_type=text, payload={text: text}, wait=0)
        stored = Signal.objects.get(id=signal.id)
        assert (stored.signal_type, stored.payload) == (text, {text: text})
    assert Task.objects.count() == len(HOSTILE) and Signal.objects.count() == len(HOSTILE)
    # Cancel (lifecycle.CANCEL_TASK) and delete (lifecycle.DELETE_FINAL_TASK) one of them.
    victim = created[HOSTILE[0]]
    services.task_cancel(task_id=victim, reason=HOSTILE[1])
    assert Task.objects.get(id=victim).error_message == HOSTILE[1]
    services.task_delete(task_id=victim)
    assert Task.objects.count() == len(HOSTILE) - 1
    # Through REST: create, then filter by the same text.
    settings.VALKA = {**settings.VALKA, "API_ANONYMOUS": True}
    client = APIClient()
    for text in HOSTILE[1:]:
        r = client.post("/api/v1/tasks", {"task_name": text + "!", "queue": "rest", "idempotency_key": text + "!"},
                        format="json")
        assert r.status_code == 201, r.content
        found = client.get("/api/v1/tasks", {"task_name": text + "!"}).json()["results"]
        assert [t["id"] for t in found] == [r.json()["id"]] and found[0]["task_name"] == text + "!"
        assert client.post("/api/v1/tasks", {"task_name": "t", "queue": text}, format="json").status_code == 400
    tables_intact()


@pytest.mark.django_db(transaction=True)
def test_statements_that_take_a_queue_are_safe_with_hostile_ones():
    now = db_now()
    ready = Listener("valka_task_ready")
    try:
        # dispatcher.sql.CLAIM and UNSEND, with a hostile queue and node id.
        for text in HOSTILE:
            task = TaskFactory(queue=text, task_name=text)
            TaskFactory(queue=text + "x")  # a neighbour that must not be claimed
            with connection.cursor() as cursor:
                cursor.execute(dispatcher_sql.CLAIM, dispatcher_sql.claim_params(queue=text, limit=10, node_id=text))
                claimed = cursor.fetchall()
                assert [(str(r[0]), r[1], r[2]) for r in claimed] == [(str(task.id), text, text)]
                cursor.execute(dispatcher_sql.UNSEND, {"task_ids": [task.id], "node_id": text})
            assert Task.objects.get(id=task.id).status == "PENDING"
        assert sorted(ready.drain(len(HOSTILE))) == sorted(HOSTILE), "pg_notify carried each queue as it is"

        # maintenance.RETRY_DUE (notifies per queue) and DEAD_LETTER_TASKS, through the retry engine.
        retrying = {text: TaskFactory(status="RETRY", queue=text, task_name=text, attempt_count=1,
                                      run_at=now - timedelta(seconds=1)) for text in HOSTILE[:4]}
        exhausted = TaskFactory(status="RETRY", queue=HOSTILE[4], task_name=HOSTILE[5], attempt_count=4,
                                max_retries=3, error_message=HOSTILE[6], run_at=now)
        assert once(RetryEngine(make_config())) == len(retrying) + 1
        assert all(Task.objects.get(id=t.id).status == "PENDING" for t in retrying.values())
        assert sorted(ready.drain(len(retrying))) == sorted(HOSTILE[:4])
        letter = DeadLetter.objects.get(task_id=exhausted.id)
        assert (letter.queue, letter.task_name, letter.error_message) == (HOSTILE[4], HOSTILE[5], HOSTILE[6])
        # A replay goes through the producers' validation, which refuses such a queue, and writes nothing.
        count = Task.objects.count()
        with pytest.raises(ValidationError):
            services.dead_letter_replay(dead_letter_id=letter.id)
        assert Task.objects.count() == count and DeadLetter.objects.get(id=letter.id).replay_count == 0

        # maintenance.DUE_DELAYED through the promoter: announced with the queue as it is.
        delayed = TaskFactory(queue=HOSTILE[7], run_at=now + timedelta(seconds=5), created_at=now)
        promoter = DelayedPromoter(make_config())
        once(promoter, now=now)
        ready.drain(0)
        assert once(promoter, now=now + timedelta(seconds=6)) == 1
        assert ready.drain(1) == [HOSTILE[7]]
        assert Task.objects.get(id=delayed.id).status == "PENDING"

        # maintenance.STALE_WORKERS / RUNS_OF_WORKERS and EXPIRED_LEASES with hostile worker ids.
        silent = WorkerFactory(id=HOSTILE[8], name=HOSTILE[9], queues=[HOSTILE[10]],
                               last_heartbeat_at=now - timedelta(hours=1))
        run = TaskRunFactory(task=TaskFactory(status="RUNNING", attempt_count=1, queue=HOSTILE[10]),
                             worker_id=silent.id, lease_expires_at=now + timedelta(hours=1))
        assert once(WorkerJanitor(make_config())) >= 1
        assert Worker.objects.get(id=HOSTILE[8]).status == "DISCONNECTED"
        assert TaskRun.objects.get(id=run.id).status == "LOST"
        expired = TaskRunFactory(task=TaskFactory(status="RUNNING", attempt_count=1, queue=HOSTILE[11]),
                                 worker_id=HOSTILE[12], lease_expires_at=now - timedelta(seconds=1))
        once(LeaseReaper(make_config()))
        assert TaskRun.objects.get(id=expired.id).status == "LOST"

        # maintenance.PRUNE_FINISHED: only the old finished ones go.
        old = TaskFactory(status="COMPLETED", queue=HOSTILE[13], task_name=HOSTILE[13])
        Task.objects.filter(id=old.id).update(finished_at=now - timedelta(days=30))
        kept = TaskFactory(status="COMPLETED", queue=HOSTILE[13])
        once(Retention(make_config()))
        assert not Task.objects.filter(id=old.id).exists() and Task.objects.filter(id=kept.id).exists()
    finally:
        ready.close()
    tables_intact()


def test_a_worker_on_hostile_queues_gets_its_tasks_and_signals(stack):
    """The real claim path: a worker's hello names the queues, the dispatcher claims from them."""
    _, addr = stack.dispatcher()
    queues, worker_id = HOSTILE[:3], HOSTILE[3]
    tasks = [TaskFactory(queue=q, task_name=q, input={q: q}) for q in queues]
    raw = Raw(addr, [hello(queues=queues, worker_id=worker_id, concurrency=len(queues))])
    assignments = {a.task_id: a for a in (raw.next("task_assignment") for _ in queues)}
    assert set(assignments) == {str(t.id) for t in tasks}
    for task in tasks:
        a = assignments[str(task.id)]
        assert (a.queue_name, a.task_name) == (task.queue, task.task_name)
    assert Worker.objects.get(id=worker_id).queues == queues
    target = tasks[0]
    wait_status(target.id, "RUNNING")
    signal, delivered = signal_send(task_id=target.id, signal_type=HOSTILE[4], payload=HOSTILE[5], wait=5.0)
    received = raw.next("task_signal")
    assert (received.signal_id, received.signal_name) == (str(signal.id), HOSTILE[4]) and delivered
    assert json.loads(received.payload) == HOSTILE[5]
    for task in tasks:
        a = assignments[str(task.id)]
        raw.send(task_result=pb.TaskResult(task_id=a.task_id, task_run_id=a.task_run_id, success=True,
                                           output=json.dumps({"q": task.queue})))
    for task in tasks:
        assert wait_status(task.id, "COMPLETED").output == {"q": task.queue}
    raw.close()
    tables_intact()
