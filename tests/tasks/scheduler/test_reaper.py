"""The lease reaper: expired runs, stuck DISPATCHING tasks, and its races with
heartbeats and cancels (each settled by row locks, never by overruling)."""

import asyncio
from datetime import timedelta

import pytest

from dispatcher import sql as dispatcher_sql
from tasks.models import DeadLetter, Task, TaskRun
from tasks.scheduler.reaper import LeaseReaper
from tasks.sql import lifecycle
from tests.factories import TaskFactory, TaskRunFactory
from tests.helpers import connect, db_now, make_config, once, run_async

pytestmark = pytest.mark.django_db(transaction=True)


def expired_run(**task):
    now = db_now()
    values = {"status": "RUNNING", "attempt_count": 1, "max_retries": 3, **task}
    return TaskRunFactory(task=TaskFactory(**values), attempt_number=values["attempt_count"],
                          lease_expires_at=now - timedelta(seconds=1))


def test_expired_lease_is_lost_and_the_task_retries_with_backoff():
    run = expired_run()
    alive = TaskRunFactory(lease_expires_at=db_now() + timedelta(seconds=60))

    assert once(LeaseReaper(make_config())) == 2  # one run closed, one task moved

    run.refresh_from_db()
    assert run.status == "LOST" and run.error_message == "lease expired" and run.finished_at
    task = Task.objects.get(id=run.task_id)
    assert task.status == "RETRY" and task.error_message == "lease expired" and task.attempt_count == 1
    # First backoff: 1 s ± 25%.
    assert 0.75 <= (task.run_at - task.updated_at).total_seconds() <= 1.25
    assert TaskRun.objects.get(id=alive.id).status == "RUNNING"
    assert Task.objects.get(id=alive.task_id).status == "RUNNING"


def test_expired_lease_on_the_last_attempt_dead_letters():
    run = expired_run(attempt_count=4, max_retries=3)
    assert once(LeaseReaper(make_config())) == 2
    assert Task.objects.get(id=run.task_id).status == "DEAD_LETTER"
    assert DeadLetter.objects.filter(task_id=run.task_id).count() == 1
    assert DeadLetter.objects.get(task_id=run.task_id).error_message == "lease expired"
    assert once(LeaseReaper(make_config())) == 0
    assert DeadLetter.objects.count() == 1


def test_explicit_now_decides_what_has_expired():
    now = db_now()
    run = TaskRunFactory(lease_expires_at=now + timedelta(seconds=30))
    reaper = LeaseReaper(make_config())
    assert once(reaper, now=now + timedelta(seconds=30)) == 0  # expires *after* its time, not at it
    assert once(reaper, now=now + timedelta(seconds=31)) == 2
    assert TaskRun.objects.get(id=run.id).status == "LOST"


def _heartbeat_params(run):
    return {"worker_ids": [run.worker_id], "task_ids": [run.task_id], "extension": 60}


def test_a_heartbeat_in_flight_wins_over_the_reaper():
    """The heartbeat holds the run row: the reaper skips it, and once it commits the lease is fresh."""
    run = expired_run()
    reaper = LeaseReaper(make_config())

    async def scenario() -> tuple[int, int, int]:
        async with await connect() as worker_side, await connect() as conn:
            async with worker_side.transaction():
                cur = await worker_side.execute(dispatcher_sql.HEARTBEAT, _heartbeat_params(run))
                extended = len(await cur.fetchall())
                during = await reaper.run_once(conn)
            return extended, during, await reaper.run_once(conn)

    assert run_async(scenario) == (1, 0, 0)
    run = TaskRun.objects.get(id=run.id)
    assert run.status == "RUNNING" and run.lease_expires_at > db_now() + timedelta(seconds=50)
    assert Task.objects.get(id=run.task_id).status == "RUNNING"


def test_a_heartbeat_arriving_while_the_reaper_holds_the_run_changes_nothing():
    run = expired_run()
    lease = run.lease_expires_at
    reaper = LeaseReaper(make_config())

    async def scenario() -> tuple[int, bool, int]:
        async with await connect() as worker_side, await connect() as conn:
            async with conn.transaction():
                closed, _ = await reaper.lease_batch(conn)
                beat = asyncio.ensure_future(worker_side.execute(dispatcher_sql.HEARTBEAT, _heartbeat_params(run)))
                await asyncio.sleep(0.3)
                waited = not beat.done()  # it must wait for our lock, not extend the old row
            cur = await beat
            return closed, waited, len(await cur.fetchall())

    assert run_async(scenario) == (1, True, 0)
    run = TaskRun.objects.get(id=run.id)
    assert run.status == "LOST" and run.lease_expires_at == lease
    assert Task.objects.get(id=run.task_id).status == "RETRY"


def test_a_cancel_in_flight_is_not_overruled():
    """The cancel holds the task: the reaper skips it; after the commit the task is CANCELLED
    and its run CANCELLED (not LOST), and further passes change nothing."""
    run = expired_run()
    reaper = LeaseReaper(make_config())

    async def scenario() -> tuple[int, int, int]:
        async with await connect() as api, await connect() as conn:
            async with api.transaction():
                cur = await api.execute(lifecycle.CANCEL_TASK, {"id": run.task_id, "reason": "stop"})
                cancelled = len(await cur.fetchall())
                during = await reaper.run_once(conn)
            return cancelled, during, await reaper.run_once(conn)

    assert run_async(scenario) == (1, 0, 0)
    assert Task.objects.get(id=run.task_id).status == "CANCELLED"
    assert TaskRun.objects.get(id=run.id).status == "CANCELLED"


def test_a_cancel_arriving_while_the_reaper_holds_the_task_loses_cleanly():
    run = expired_run()
    reaper = LeaseReaper(make_config())

    async def scenario() -> tuple[int, bool, int]:
        async with await connect() as api, await connect() as conn:
            async with conn.transaction():
                closed, _ = await reaper.lease_batch(conn)
                cancel = asyncio.ensure_future(api.execute(lifecycle.CANCEL_TASK, {"id": run.task_id, "reason": "x"}))
                await asyncio.sleep(0.3)
                waited = not cancel.done()
            cur = await cancel
            return closed, waited, len(await cur.fetchall())

    assert run_async(scenario) == (1, True, 0)  # RETRY cannot be cancelled: no row, no error
    assert Task.objects.get(id=run.task_id).status == "RETRY"
    assert TaskRun.objects.get(id=run.id).status == "LOST"


def test_a_cancelled_task_keeps_its_status_when_a_stale_run_is_closed():
    run = expired_run(status="CANCELLED")
    assert once(LeaseReaper(make_config())) == 1  # the run only
    assert TaskRun.objects.get(id=run.id).status == "LOST"
    task = Task.objects.get(id=run.task_id)
    assert task.status == "CANCELLED" and DeadLetter.objects.count() == 0


def test_stuck_dispatching_goes_back_to_pending_without_counting_an_attempt(listen):
    now = db_now()
    stuck = TaskFactory(status="DISPATCHING", queue="lost-and-found", claimed_by="dead-node",
                        attempt_count=1, updated_at=now - timedelta(seconds=61))
    recent = TaskFactory(status="DISPATCHING", claimed_by="live-node", updated_at=now - timedelta(seconds=10))
    listener = listen()

    assert once(LeaseReaper(make_config(dispatching_timeout=60))) == 1

    task = Task.objects.get(id=stuck.id)
    assert task.status == "PENDING" and task.attempt_count == 1 and task.claimed_by is None
    assert Task.objects.get(id=recent.id).status == "DISPATCHING"
    assert listener.drain(1) == ["lost-and-found"]
    # The dead node's late "sent" finds nothing to start.

    async def late_start() -> int:
        async with await connect() as conn:
            cur = await conn.execute(dispatcher_sql.START_RUNS, {
                "task_ids": [stuck.id], "run_ids": [TaskRun._meta.pk.default()], "worker_ids": ["w"],
                "node_id": "dead-node"})
            return len(await cur.fetchall())

    assert run_async(late_start) == 0
    assert Task.objects.get(id=stuck.id).status == "PENDING"


def test_stuck_dispatching_tasks_of_every_queue_are_recovered_batch_by_batch(listen):
    """The reaper walks the queues one by one; a batch smaller than what is stuck is repeated."""
    now = db_now()
    old = now - timedelta(seconds=61)
    stuck = [TaskFactory(status="DISPATCHING", queue=queue, claimed_by="dead-node", updated_at=old)
             for queue in ("alpha", "alpha", "alpha", "gamma", "zeta")]
    TaskFactory(status="COMPLETED", queue="beta", finished_at=now)
    TaskFactory(status="PENDING", queue="delta")
    recent = TaskFactory(status="DISPATCHING", queue="gamma", claimed_by="live-node",
                         updated_at=now - timedelta(seconds=10))
    listener = listen()

    assert once(LeaseReaper(make_config(dispatching_timeout=60, batch_size=2))) == 5

    assert set(Task.objects.filter(id__in=[t.id for t in stuck]).values_list("status", flat=True)) == {"PENDING"}
    assert Task.objects.get(id=recent.id).status == "DISPATCHING"
    assert sorted(set(listener.drain(4))) == ["alpha", "gamma", "zeta"]  # batches of 2: four commits


def test_nothing_is_judged_on_time_the_database_was_out_of_reach():
    """After an outage (the scheduler sees the database again from `watching_since`), an expired lease
    gets a whole lease extension for its worker's heartbeat to come back, and a stuck claim its
    whole timeout for its start."""
    now = db_now()
    run = expired_run()
    stuck = TaskFactory(status="DISPATCHING", claimed_by="node-1", updated_at=now - timedelta(seconds=600))
    reaper = LeaseReaper(make_config(lease_grace=15, dispatching_timeout=60))
    reaper.watching_since = now  # the database came back just now
    assert once(reaper, now=now + timedelta(seconds=14)) == 0
    assert TaskRun.objects.get(id=run.id).status == "RUNNING"
    assert once(reaper, now=now + timedelta(seconds=16)) == 2  # the lease's grace is over; not yet the claim's
    assert Task.objects.get(id=stuck.id).status == "DISPATCHING"
    assert once(reaper, now=now + timedelta(seconds=61)) == 1
    assert Task.objects.get(id=stuck.id).status == "PENDING"
