"""Leader election on the advisory lock, in one process: two candidates, one leader;
a leader whose lock connection dies demotes itself and the other takes over."""

import asyncio
import random

import pytest

from tasks.scheduler.leader import Leader
from tests.helpers import connect, run_async
from valka.db import conninfo

pytestmark = pytest.mark.django_db(transaction=True)


def candidate(name: str, key: int) -> Leader:
    """A candidate whose connections carry `name` and the test's `key`: tests running at once on
    one server (pytest-xdist) must not terminate each other's connections by name."""
    return Leader(conninfo(application_name=f"{name}-{key}"), key=key, retry_interval=0.1, check_interval=0.1,
                  check_timeout=2.0)


async def until(event: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), seconds)
        return True
    except TimeoutError:
        return False


async def terminate(application_name: str) -> int:
    async with await connect() as admin:
        cur = await admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            [application_name])
        return (await cur.fetchone())[0]


def test_one_leader_then_takeover_when_its_connection_dies():
    key = random.randrange(1, 2**62)
    a, b = candidate("valka-test-leader-a", key), candidate("valka-test-leader-b", key)

    async def scenario() -> None:
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        ta = asyncio.create_task(a.run(stop_a))
        assert await until(a.leading, 5), "the only candidate leads"
        tb = asyncio.create_task(b.run(stop_b))
        await asyncio.sleep(0.5)  # b campaigns a few times meanwhile
        assert a.is_leader and not b.is_leader

        assert await terminate(f"valka-test-leader-a-{key}") == 1
        # Liveness bounds only: a notices within a few checks, b wins within a few tries.
        assert await until(a.standby, 3), "a leader whose lock connection died steps down"
        assert await until(b.leading, 5), "the standby takes over"
        await asyncio.sleep(0.5)  # a reconnects and campaigns, but b holds the lock
        assert b.is_leader and not a.is_leader

        stop_a.set()
        stop_b.set()
        await asyncio.gather(ta, tb)
        assert a.standby.is_set() and b.standby.is_set()

    run_async(scenario)


def test_a_stopped_leader_releases_the_lock_at_once():
    key = random.randrange(1, 2**62)
    a, b = candidate("valka-test-leader-a", key), candidate("valka-test-leader-b", key)

    async def scenario() -> None:
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        ta = asyncio.create_task(a.run(stop_a))
        assert await until(a.leading, 5)
        tb = asyncio.create_task(b.run(stop_b))
        await asyncio.sleep(0.3)
        assert not b.is_leader
        stop_a.set()
        await ta
        assert not a.is_leader
        assert await until(b.leading, 3)
        stop_b.set()
        await tb

    run_async(scenario)


def test_a_candidate_keeps_trying_while_the_database_refuses_it():
    """A wrong address is one more failure to back off from, never a crash."""
    bad = Leader(conninfo(application_name="x").replace("dbname=", "dbname=no_such_db_"), retry_interval=0.1)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(bad.run(stop))
        await asyncio.sleep(1.0)
        assert not task.done() and not bad.is_leader
        stop.set()
        await asyncio.wait_for(task, 10)

    run_async(scenario)
