"""A process's fanout: it watches task events only while it has subscribers (and a short while after),
and hands each subscriber the events it asked for."""

import asyncio
import json

import psycopg
import pytest

from tasks.live import LAGGED, QUEUE_LIMIT, Fanout, decode_events
from tasks.notify import TASK_EVENT
from tests.helpers import database_url, no_event_watchers_left

pytestmark = pytest.mark.django_db(transaction=True)

INSERT = ("INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count, timeout_seconds,"
          " metadata) VALUES (gen_random_uuid(), 't', 'fanout', 'PENDING', 0, 0, 0, 60, '{}')")


async def _watchers(conn: psycopg.AsyncConnection) -> list[int]:
    cur = await conn.execute("SELECT pid FROM task_event_watchers")
    return [row[0] for row in await cur.fetchall()]


async def _eventually(predicate, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)


async def _scenario() -> None:
    fanout = Fanout(database_url(), linger=0.2)
    async with await psycopg.AsyncConnection.connect(database_url(), autocommit=True) as conn:
        inbox = fanout.subscribe(TASK_EVENT)
        await fanout.ready(30)
        assert len(await _watchers(conn)) == 1  # registered before it reported itself ready

        await conn.execute(INSERT)
        payload = await asyncio.wait_for(inbox.get(), 5)
        assert [e["queue_name"] for e in json.loads(payload)] == ["fanout"]

        second = fanout.subscribe(TASK_EVENT)
        fanout.unsubscribe(TASK_EVENT, inbox)
        await asyncio.sleep(0.4)
        assert len(await _watchers(conn)) == 1  # one subscriber is still there

        fanout.unsubscribe(TASK_EVENT, second)
        fanout.subscribe(TASK_EVENT)  # back within the linger: the same connection goes on
        fanout.unsubscribe(TASK_EVENT, fanout.subscribe(TASK_EVENT))
        await asyncio.sleep(0.4)
        watching = await _watchers(conn)
        assert len(watching) == 1

        for queue in list(fanout._subscribers[TASK_EVENT]):
            fanout.unsubscribe(TASK_EVENT, queue)

        async def released() -> bool:
            return await _watchers(conn) == []

        await _eventually(released)  # the last one left: the watcher removed itself

        again = fanout.subscribe(TASK_EVENT)  # a new subscriber opens a new watcher
        await fanout.ready(30)
        assert len(await _watchers(conn)) == 1 and await _watchers(conn) != watching
        await conn.execute(INSERT)
        assert json.loads(await asyncio.wait_for(again.get(), 5))[0]["new_status"] == "PENDING"
        await fanout.close()
        await _eventually(released)


def test_the_fanout_watches_events_only_while_it_has_subscribers():
    no_event_watchers_left()
    asyncio.run(_scenario())


def test_decode_events_keeps_the_events_of_the_queue_asked_for():
    payload = json.dumps([{"task_id": "a", "queue_name": "emails"}, {"task_id": "b", "queue_name": "reports"}])
    assert [e["task_id"] for e in decode_events(payload)] == ["a", "b"]
    assert [e["task_id"] for e in decode_events(payload, queue="reports")] == ["b"]
    assert decode_events(payload, queue="other") == []
    assert decode_events(json.dumps({"task_id": "c", "queue_name": "emails"}), queue="emails") == [
        {"task_id": "c", "queue_name": "emails"}]
    assert decode_events("not json") == []


def test_a_subscriber_that_falls_behind_is_dropped_with_the_lagged_marker():
    async def scenario() -> tuple[list[str], list[str], bool]:
        fanout = Fanout()  # no LISTEN connection: payloads are published by hand
        slow, quick = fanout.subscribe(TASK_EVENT), fanout.subscribe(TASK_EVENT)
        publish = fanout.publisher(TASK_EVENT)
        seen = []
        for i in range(QUEUE_LIMIT + 5):
            publish(str(i))
            seen.append(await quick.get())  # this one keeps up
        left = []
        while not slow.empty():
            left.append(slow.get_nowait())
        return left, seen, fanout.has_subscribers(TASK_EVENT)

    left, seen, still = asyncio.run(scenario())
    assert left == [LAGGED]  # nothing buffered beyond the limit: only the news that it lagged
    assert seen == [str(i) for i in range(QUEUE_LIMIT + 5)]
    assert still  # the quick one is still subscribed
