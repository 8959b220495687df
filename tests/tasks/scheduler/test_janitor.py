"""The worker janitor: silent workers are disconnected and their runs lost, live ones untouched."""

from datetime import timedelta

import pytest
from django.db import connection

from dispatcher import sql as dispatcher_sql
from tasks.models import DeadLetter, Task, TaskRun, Worker
from tasks.scheduler.janitor import WorkerJanitor
from tests.factories import TaskFactory, TaskRunFactory, WorkerFactory
from tests.helpers import connect, db_now, make_config, once, run_async

pytestmark = pytest.mark.django_db(transaction=True)


def running_on(worker, **task):
    values = {"status": "RUNNING", "attempt_count": 1, "max_retries": 3, **task}
    return TaskRunFactory(task=TaskFactory(**values), attempt_number=values["attempt_count"], worker_id=worker.id,
                          lease_expires_at=db_now() + timedelta(minutes=5))


def test_silent_workers_are_disconnected_and_their_runs_lost():
    now = db_now()
    silent = WorkerFactory(last_heartbeat_at=now - timedelta(seconds=121))
    alive = WorkerFactory(last_heartbeat_at=now - timedelta(seconds=30))
    gone = WorkerFactory(status="DISCONNECTED", last_heartbeat_at=now - timedelta(hours=1))
    lost, last_chance = running_on(silent), running_on(silent, attempt_count=4)
    kept = running_on(alive)

    assert once(WorkerJanitor(make_config(worker_timeout=120))) == 3  # one worker, two tasks

    worker = Worker.objects.get(id=silent.id)
    assert worker.status == "DISCONNECTED" and worker.disconnected_at is not None
    run = TaskRun.objects.get(id=lost.id)
    assert run.status == "LOST" and run.error_message == "worker disconnected"
    assert Task.objects.get(id=lost.task_id).status == "RETRY"
    assert Task.objects.get(id=last_chance.task_id).status == "DEAD_LETTER"
    assert DeadLetter.objects.filter(task_id=last_chance.task_id).count() == 1
    assert Worker.objects.get(id=alive.id).status == "CONNECTED"
    assert TaskRun.objects.get(id=kept.id).status == "RUNNING"
    assert Worker.objects.get(id=gone.id).disconnected_at is None  # left as it was
    assert once(WorkerJanitor(make_config(worker_timeout=120))) == 0


def test_explicit_now_decides_who_is_silent():
    now = db_now()
    worker = WorkerFactory(last_heartbeat_at=now)
    janitor = WorkerJanitor(make_config(worker_timeout=120))
    assert once(janitor, now=now + timedelta(seconds=119)) == 0
    assert once(janitor, now=now + timedelta(seconds=121)) == 1
    assert Worker.objects.get(id=worker.id).status == "DISCONNECTED"


def test_a_worker_touched_by_its_dispatcher_meanwhile_stays_connected():
    silent = WorkerFactory(last_heartbeat_at=db_now() - timedelta(seconds=500), node_id="node-a")
    run = running_on(silent)
    janitor = WorkerJanitor(make_config(worker_timeout=120))

    async def scenario() -> tuple[int, int]:
        async with await connect() as dispatcher, await connect() as conn:
            async with dispatcher.transaction():
                await dispatcher.execute(dispatcher_sql.TOUCH_WORKERS, {
                    "worker_ids": [silent.id], "session_ids": [silent.session_id], "node_id": "node-a"})
                during = await janitor.run_once(conn)
            return during, await janitor.run_once(conn)

    assert run_async(scenario) == (0, 0)
    assert Worker.objects.get(id=silent.id).status == "CONNECTED"
    assert TaskRun.objects.get(id=run.id).status == "RUNNING"


def test_event_watchers_whose_session_ended_are_forgotten():
    with connection.cursor() as cur:
        cur.execute("INSERT INTO task_event_watchers VALUES (0, now())")  # pid 0 is never a session
    once(WorkerJanitor(make_config()))
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM task_event_watchers WHERE pid = 0")
        assert cur.fetchone()[0] == 0


def test_silence_is_counted_only_from_when_the_database_came_back():
    now = db_now()
    silent = WorkerFactory(last_heartbeat_at=now - timedelta(seconds=500))
    running_on(silent)
    janitor = WorkerJanitor(make_config(worker_timeout=120))
    janitor.watching_since = now  # an outage just ended: the worker's dispatcher could not write either
    assert once(janitor, now=now + timedelta(seconds=119)) == 0
    assert Worker.objects.get(id=silent.id).status == "CONNECTED"
    assert once(janitor, now=now + timedelta(seconds=121)) == 2  # the worker, and its task
    assert Worker.objects.get(id=silent.id).status == "DISCONNECTED"
