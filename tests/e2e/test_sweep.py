"""What a lost notification would have said, found in the rows: the dispatcher's sweep.

A cancel or a signal whose NOTIFY fell in a gap of the dispatcher's LISTEN connection, and a run
the cluster closed behind its worker's back (its lease reaped while the worker was frozen), still
reach the worker, within the sweep's interval.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psycopg

from signals import services as signal_services
from signals.models import Signal
from tasks import services
from tasks.models import Task, TaskRun
from tests.helpers import database_url, wait_for, wait_status


def _marked(folder: Path, task_id, what: str) -> bool:
    return any(folder.glob(f"{task_id}.{what}.*"))


def _cut_listen_connections(stop: threading.Event) -> None:
    """Terminate the dispatchers' LISTEN connections, again and again, until `stop`."""
    with psycopg.connect(database_url(), autocommit=True) as admin:
        while not stop.is_set():
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name LIKE 'valka-dispatcher-listen %' AND datname = current_database()")
            time.sleep(0.02)


def test_a_cancel_and_a_signal_sent_while_listen_was_down_reach_the_worker(stack, tmp_path):
    _, addr = stack.dispatcher(VALKA_DISPATCH_SWEEP_INTERVAL="2")
    stack.worker(addr, queues="sweep", concurrency=4, name="swept")
    marks = tmp_path / "marks"
    marks.mkdir()
    long = services.task_enqueue(task_name="sleep", queue="sweep", input={"seconds": 60, "mark": str(marks)})
    waiter = services.task_enqueue(task_name="collect_signals", queue="sweep", input={"count": 1})
    wait_status(long.id, "RUNNING")
    wait_status(waiter.id, "RUNNING")
    wait_for(lambda: _marked(marks, long.id, "started"), what="the long task's handler")

    stop = threading.Event()
    cutter = threading.Thread(target=_cut_listen_connections, args=(stop,))
    cutter.start()
    try:
        time.sleep(0.5)  # the LISTEN connection is down, and every new one is cut at once
        services.task_cancel(task_id=long.id)
        sent, _ = signal_services.signal_send(task_id=waiter.id, signal_type="ping", wait=0)
        sent_at = time.monotonic()
        time.sleep(1.0)
    finally:
        stop.set()
        cutter.join()

    # Their NOTIFYs were lost: the sweep finds both in the rows.
    wait_for(lambda: _marked(marks, long.id, "cancelled"), timeout=10, what="the cancel on the worker")
    wait_for(lambda: Signal.objects.get(id=sent.id).status == "ACKNOWLEDGED", timeout=10, what="the signal")
    assert time.monotonic() - sent_at < 10
    wait_status(waiter.id, "COMPLETED")
    assert Task.objects.get(id=long.id).status == "CANCELLED"


def test_a_worker_frozen_until_its_run_is_reaped_is_told_to_stop_when_it_thaws(stack, tmp_path):
    _, addr = stack.dispatcher(VALKA_LEASE_EXTENSION="4", VALKA_DISPATCH_SWEEP_INTERVAL="1")
    # The retry waits long enough that the task does not run again during the test. The scheduler
    # shares the dispatcher's lease extension, as a deployment's processes do: it is also the
    # reaper's grace after PostgreSQL started (tasks.sql.maintenance.EXPIRED_LEASES), which with the
    # default of 60 s outlasts the test on a cluster started a moment ago.
    stack.scheduler(VALKA_REAPER_INTERVAL="0.5", VALKA_RETRY_BASE_DELAY="60", VALKA_RETRY_JITTER="0",
                    VALKA_LEASE_EXTENSION="4")
    frozen = stack.worker(addr, queues="freeze", concurrency=1, name="frozen", heartbeat=0.5)
    marks = tmp_path / "marks"
    marks.mkdir()
    task = services.task_enqueue(task_name="sleep", queue="freeze", input={"seconds": 30, "mark": str(marks)},
                                 timeout_seconds=4, max_retries=1)
    wait_status(task.id, "RUNNING")
    wait_for(lambda: _marked(marks, task.id, "started"), what="the handler")
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        run = wait_for(lambda: TaskRun.objects.filter(task_id=task.id, status="LOST").first(), timeout=20,
                       what="the run reaped")
        assert not _marked(marks, task.id, "cancelled")
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    thawed_at = time.monotonic()
    wait_for(lambda: _marked(marks, task.id, "cancelled"), timeout=10, what="the handler told to stop")
    assert time.monotonic() - thawed_at < 5  # within a heartbeat or two and a sweep
    time.sleep(1.0)  # the handler's late result reaches the dispatcher, and changes nothing
    run.refresh_from_db()
    assert (run.status, run.error_message) == ("LOST", "lease expired")
    task.refresh_from_db()
    assert (task.status, task.attempt_count) == ("RETRY", 1)
