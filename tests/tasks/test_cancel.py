"""Cancelling a task (`services.task_cancel`) while other processes move it."""

import threading
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from dispatcher import sql as dispatcher_sql
from tasks import services
from tasks.models import Task, TaskRun
from tests.factories import TaskFactory, TaskRunFactory
from tests.helpers import database_url

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_cancel_waiting_on_a_start_closes_the_run_the_start_wrote():
    """The dispatcher's start (DISPATCHING → RUNNING with its run row) holds the task when the cancel
    comes: the cancel waits for it, and must then close the run the start wrote, not only the task."""
    task = TaskFactory(status="DISPATCHING", claimed_by="node-1")
    run_id = uuid.uuid4()
    with psycopg.connect(database_url()) as dispatcher:
        with dispatcher.transaction():
            cur = dispatcher.execute(dispatcher_sql.START_RUNS, {
                "task_ids": [task.id], "run_ids": [run_id], "worker_ids": ["w"], "node_id": "node-1"})
            assert cur.fetchall()  # started, not yet committed: the task row is locked
            cancelled = []

            def cancel() -> None:
                try:
                    cancelled.append(services.task_cancel(task_id=task.id))
                finally:
                    connection.close()  # this thread's own connection

            canceller = threading.Thread(target=cancel)
            canceller.start()
            canceller.join(0.5)
            assert canceller.is_alive()  # waiting for the start to commit
        canceller.join(10)
    assert cancelled and cancelled[0].status == "CANCELLED"
    assert Task.objects.get(id=task.id).status == "CANCELLED"
    run = TaskRun.objects.get(id=run_id)
    assert (run.status, run.finished_at is not None) == ("CANCELLED", True)


def test_a_run_a_cancel_closes_ends_no_earlier_than_it_started():
    """A cancel whose transaction began before the start it waited for committed (its now() is the
    earlier) still ends the run at or after the run's start."""
    started = timezone.now() + timedelta(seconds=5)
    run = TaskRunFactory(started_at=started, task__started_at=started)
    services.task_cancel(task_id=run.task_id)
    run.refresh_from_db()
    assert run.status == "CANCELLED" and run.finished_at >= run.started_at
    task = Task.objects.get(id=run.task_id)  # the task's own times too
    assert task.status == "CANCELLED" and task.finished_at >= task.started_at == started
