"""Claiming a task by the id its insert's NOTIFY named (CLAIM_IDS): only when a full claim would
take the same tasks, so no queue is taken out of order."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest

from dispatcher import claimer as claimer_module
from dispatcher import sql
from tasks.models import Queue, Task
from tasks.services import task_enqueue
from tests.dispatcher.test_claimer import Slots, _claimer
from tests.factories import TaskFactory
from tests.helpers import database_url, db_now
from valka.db import make_pool

pytestmark = pytest.mark.django_db(transaction=True)


def _claim_ids(queue: str, ids: list) -> list[tuple] | None:
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(sql.CLAIM_SESSION)
        rows = conn.execute(sql.CLAIM_IDS, {"queue": queue, "ids": [str(i) for i in ids],
                                            "node_id": "ids-test"}).fetchall()
    return None if rows and rows[0][0] is None else rows


def test_claim_ids_takes_only_the_named_tasks_that_are_due_and_pending():
    named = task_enqueue(task_name="t", queue="q")
    other = task_enqueue(task_name="t", queue="q")  # pending, but not named
    elsewhere = task_enqueue(task_name="t", queue="r")
    later = TaskFactory(queue="q", run_at=db_now() + timedelta(hours=1))
    gone = TaskFactory(queue="q", status="CANCELLED", finished_at=db_now())
    rows = _claim_ids("q", [named.id, elsewhere.id, later.id, gone.id])
    assert [r[0] for r in rows] == [str(named.id)]
    assert _claim_ids("q", [named.id]) == []  # claimed already: a second dispatcher gets nothing
    assert Task.objects.get(id=named.id).status == "DISPATCHING"
    assert Task.objects.get(id=other.id).status == Task.objects.get(id=elsewhere.id).status == "PENDING"


def test_claim_ids_refuses_a_queue_with_controls():
    task = task_enqueue(task_name="t", queue="held")
    Queue.objects.filter(name="held").update(max_running=3)  # the task's insert made the row
    assert _claim_ids("held", [task.id]) is None


async def _passes(steps) -> list[tuple[str, list[str]]]:
    """Run `steps` (callables of the claimer) in turn; what each pass sent and which statement claimed."""
    slots = Slots(10)
    pool = make_pool("ids-test", min_size=1, max_size=1, session=sql.CLAIM_SESSION)
    await pool.open()
    claimer = _claimer(slots, pool)
    used: list[str] = []
    full, by_id = claimer_module.claim, claimer_module.claim_ids

    async def counted_full(*args, **kwargs):
        used.append("CLAIM")
        return await full(*args, **kwargs)

    async def counted_ids(*args, **kwargs):
        used.append("CLAIM_IDS")
        return await by_id(*args, **kwargs)

    claimer_module.claim, claimer_module.claim_ids = counted_full, counted_ids
    out = []
    try:
        for step in steps:
            slots.taken, slots.sent, used[:] = 0, [], []
            await step(claimer, slots)
            out.append((list(used), list(slots.sent)))
    finally:
        claimer_module.claim, claimer_module.claim_ids = full, by_id
        await pool.close()
    return out


def test_a_drained_queue_claims_a_named_task_by_its_id():
    async def full(claimer, slots):
        await claimer.claim_queue("q")

    async def named(claimer, slots):
        task = await asyncio.to_thread(task_enqueue, task_name="t", queue="q")
        await claimer.claim_queue("q", [str(task.id)])
        named.task = task

    passes = asyncio.run(_passes([full, named]))
    assert passes[0] == (["CLAIM"], [])  # came back short: nothing was due
    assert passes[1] == (["CLAIM_IDS"], [str(named.task.id)])


def test_a_backlog_is_claimed_in_order_whatever_the_notify_named():
    first = [task_enqueue(task_name="t", queue="q") for _ in range(12)]  # more than the 10 slots

    async def full(claimer, slots):
        await claimer.claim_queue("q")  # full: a backlog remains

    async def named(claimer, slots):
        task = await asyncio.to_thread(task_enqueue, task_name="t", queue="q")
        await claimer.claim_queue("q", [str(task.id)])
        named.task = task

    passes = asyncio.run(_passes([full, named]))
    assert passes[0] == (["CLAIM"], [str(t.id) for t in first[:10]])
    # Not by id: the two older tasks first, then the new one (after the floor, then from the start).
    used, sent = passes[1]
    assert "CLAIM_IDS" not in used and sent == [str(t.id) for t in first[10:]] + [str(named.task.id)]


def test_more_named_tasks_than_free_slots_are_claimed_by_priority():
    async def full(claimer, slots):
        await claimer.claim_queue("q")

    async def two_named_one_slot(claimer, slots):
        low = await asyncio.to_thread(task_enqueue, task_name="t", queue="q", priority=0)
        high = await asyncio.to_thread(task_enqueue, task_name="t", queue="q", priority=5)
        slots.taken = 9
        await claimer.claim_queue("q", [str(low.id), str(high.id)])
        two_named_one_slot.high = high

    passes = asyncio.run(_passes([full, two_named_one_slot]))
    assert passes[1] == (["CLAIM"], [str(two_named_one_slot.high.id)])


def test_the_notify_payload_names_the_queue_and_maybe_the_task():
    claimer = _claimer(Slots(1))  # its session takes "q" and "floor"
    claimer.ready("q")
    claimer.ready("q 01a23363-b5f3-72f3-9256-52a2c9d665ca")
    claimer.ready("floor 01a23363-b5f3-72f3-9256-52a2c9d665cb")
    assert claimer._queues == {"q"}
    assert claimer._ids == {"q": ["01a23363-b5f3-72f3-9256-52a2c9d665ca"],
                            "floor": ["01a23363-b5f3-72f3-9256-52a2c9d665cb"]}


def test_a_queue_no_session_takes_does_not_wake_the_claims():
    async def scenario():
        slots = Slots(1)
        claimer = _claimer(slots)
        claimer.ready("emails")
        claimer.ready("emails 01a23363-b5f3-72f3-9256-52a2c9d665ca")
        assert not claimer._wake.is_set()
        assert claimer._queues == set() and claimer._ids == {}
        slots.taken = 1  # a session whose slots are all taken still takes its queue
        claimer.ready("q 01a23363-b5f3-72f3-9256-52a2c9d665cb")
        assert claimer._wake.is_set() and claimer._ids == {"q": ["01a23363-b5f3-72f3-9256-52a2c9d665cb"]}

    asyncio.run(scenario())
