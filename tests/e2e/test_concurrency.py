"""Several dispatchers and workers on one database: every task runs, never twice at once."""

from __future__ import annotations

import signal

from django.db import connection

from tasks import services
from tasks.models import Task, TaskRun, Worker
from tests.helpers import has_scheduler, wait_for, wait_status

N = 2000


def _enqueue_many(n: int, queue: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count, timeout_seconds,"
            " input, metadata, run_at, created_at, updated_at)"
            " SELECT valka_uuid7(), 'echo', %s, 'PENDING', 0, 3, 0, 300, to_jsonb(g), '{}', now(), now(), now()"
            " FROM generate_series(1, %s) g", [queue, n])
        cursor.execute("SELECT pg_notify('valka_task_ready', %s)", [queue])


def overlapping_runs() -> list:
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT a.task_id FROM task_runs a JOIN task_runs b
              ON a.task_id = b.task_id AND a.id < b.id
             AND tstzrange(a.started_at, COALESCE(a.finished_at, 'infinity')) &&
                 tstzrange(b.started_at, COALESCE(b.finished_at, 'infinity'))
        """)
        return cursor.fetchall()


def test_two_dispatchers_many_workers_every_task_once(stack):
    _, addr_a = stack.dispatcher()
    _, addr_b = stack.dispatcher()
    for i in range(2):
        stack.worker(addr_a, name=f"a{i}", concurrency=8)
        stack.worker(addr_b, name=f"b{i}", concurrency=8)
    # Every worker connected before the burst: the first ones could drain it alone otherwise.
    wait_for(lambda: Worker.objects.filter(status="CONNECTED").count() == 4, what="4 workers connected")
    _enqueue_many(N, "default")
    wait_for(lambda: Task.objects.filter(status="COMPLETED").count() == N, timeout=120,
             what=f"{N} tasks completed")
    assert TaskRun.objects.count() == N, "no task ran twice"
    assert TaskRun.objects.filter(status="COMPLETED").count() == N
    assert overlapping_runs() == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(DISTINCT worker_id) FROM task_runs")
        assert cursor.fetchone()[0] == 4, "work is spread over every worker"
    # Outputs are each task's own.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM tasks WHERE output -> 'echo' <> input")
        assert cursor.fetchone()[0] == 0


def test_dispatcher_sigterm_drains_and_workers_move_on(stack):
    proc_a, addr_a = stack.dispatcher(VALKA_SHUTDOWN_TIMEOUT="15")
    _, addr_b = stack.dispatcher()
    stack.worker(addr_a, name="on-a", concurrency=2)
    task = services.task_enqueue(task_name="sleep", queue="default", input={"seconds": 1.5})
    wait_status(task.id, "RUNNING")
    proc_a.send_signal(signal.SIGTERM)
    # The running task finishes during the drain; the dispatcher then exits cleanly.
    assert wait_status(task.id, "COMPLETED").attempt_count == 1
    assert proc_a.wait(45) == 0
    # The worker reconnects, here to the other dispatcher at the same address is gone: start one
    # worker on B and check B serves new work.
    stack.worker(addr_b, name="on-b")
    nxt = services.task_enqueue(task_name="echo", queue="default")
    wait_status(nxt.id, "COMPLETED")


def test_heartbeats_keep_a_long_task_alive_past_its_timeout(stack):
    if not has_scheduler():
        import pytest

        pytest.skip("the lease reaper (scheduler) is not available yet")
    # The first heartbeat of the run may come half a second after its start (the timer runs from
    # the connection); the lease leaves it three times that to arrive and be written.
    # The scheduler's extension too: it is the reaper's grace after PostgreSQL started, and with the
    # default the reaper would judge no lease during the test on a cluster started a moment ago.
    _, addr = stack.dispatcher(VALKA_LEASE_EXTENSION="4")
    stack.scheduler(VALKA_REAPER_INTERVAL="0.3", VALKA_SCHEDULER_MAX_SLEEP="0.3", VALKA_LEASE_EXTENSION="4")
    stack.worker(addr, heartbeat=0.5)
    task = services.task_enqueue(task_name="sleep", queue="default", input={"seconds": 6}, timeout_seconds=2)
    t = wait_status(task.id, "COMPLETED", timeout=30)
    assert t.attempt_count == 1 and TaskRun.objects.filter(task_id=task.id).count() == 1
