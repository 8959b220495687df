"""The whole scheduler in one process: it leads, its loops act, it stops cleanly and
survives losing every database connection."""

import asyncio
import logging
import os
import random
import time
from datetime import timedelta

import pytest

from tasks.models import Task
from tasks.scheduler.leader import Leader
from tasks.scheduler.runner import Scheduler
from tests.factories import TaskFactory
from tests.helpers import connect, db_now, make_config, run_async
from valka.db import conninfo

pytestmark = pytest.mark.django_db(transaction=True)


def scheduler() -> Scheduler:
    leader = Leader(conninfo(application_name=f"valka-scheduler {os.getpid()} leader"),
                    key=random.randrange(1, 2**62), retry_interval=0.1, check_interval=0.2)
    return Scheduler(make_config(max_sleep=1.0), leader=leader)


async def status_of(conn, task_id) -> str:
    cur = await conn.execute("SELECT status FROM tasks WHERE id = %s", [task_id])
    return (await cur.fetchone())[0]


async def wait_status(conn, task_id, status: str, seconds: float) -> float:
    """Poll until the task has `status`; returns the wall-clock time it was first seen."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await status_of(conn, task_id) == status:
            return time.time()
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} not {status} after {seconds}s")


def test_a_retry_becomes_pending_about_when_its_backoff_ends(caplog):
    caplog.set_level(logging.INFO, logger="valka.scheduler")
    task = TaskFactory(status="RETRY", attempt_count=1, run_at=db_now() + timedelta(seconds=1.5))
    due = task.run_at.timestamp()
    s = scheduler()

    async def scenario() -> float:
        stop = asyncio.Event()
        running = asyncio.create_task(s.run(stop))
        async with await connect() as conn:
            assert await status_of(conn, task.id) == "RETRY"
            seen = await wait_status(conn, task.id, "PENDING", 10)
        stop.set()
        await asyncio.wait_for(running, 10)
        return seen

    seen = run_async(scenario)
    assert seen >= due, "never before its backoff has elapsed"
    # Liveness bound: max_sleep is 1 s, so well within 2.5 s of its time even on a slow machine.
    assert seen - due < 2.5
    assert "retry engine: 1 tasks → PENDING" in caplog.text
    assert s.pool.closed and s.terms == 1


def test_the_scheduler_rides_out_losing_all_its_connections(caplog):
    caplog.set_level(logging.INFO, logger="valka.scheduler")
    task = TaskFactory(status="RETRY", attempt_count=1, run_at=db_now() + timedelta(seconds=2))
    s = scheduler()

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(s.run(stop))
        ours = [f"valka-scheduler {os.getpid()}%"]
        try:
            await asyncio.wait_for(s.leader.leading.wait(), 5)
            async with await connect() as conn:
                # The pool opens its connection in the background: wait for it, or the cut below
                # could find the lock connection alone.
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
                                             ours)
                    if (await cur.fetchone())[0] >= 2:
                        break
                    await asyncio.sleep(0.05)
                cur = await conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE %s",
                    ours)
                assert (await cur.fetchone())[0] >= 2  # the lock connection and at least one of the pool
                await wait_status(conn, task.id, "PENDING", 20)
            # The task may have moved before the connections were cut (a slow first election); the
            # second term must come either way.
            deadline = time.monotonic() + 20
            while s.terms < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.wait_for(running, 10)

    run_async(scenario)
    assert s.terms == 2, "it stepped down when its lock connection died, then led again"
    assert "lost the leader lock connection" in caplog.text
    assert Task.objects.get(id=task.id).status == "PENDING"
