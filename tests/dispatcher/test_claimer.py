"""The claimer's floor: during a backlog claims start after the last task claimed, and a task put
back behind the floor is still claimed, at once when the backlog ahead of it runs out."""

import asyncio
from types import SimpleNamespace

import pytest
from django.db import connection

from dispatcher import claimer as claimer_module
from dispatcher.claimer import Claimer
from dispatcher.db import make_pool
from dispatcher.sql import CLAIM_SESSION, UNSEND
from tasks.services import task_enqueue_many

pytestmark = pytest.mark.django_db(transaction=True)


class Slots:
    """A worker session with `concurrency` slots that records what it was sent."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.taken = 0
        self.sent: list[str] = []

    def free_slots(self) -> int:
        return self.concurrency - self.taken

    def reserve(self, entry) -> None:
        self.taken += 1

    def send(self, message, entry) -> None:
        self.sent.append(entry.task_id)


def _put_back(task_id: str) -> None:
    """Unsent, as when its worker's stream broke: PENDING again, with its old due time. Runs in a
    thread of its own, whose connection it closes (left open, it kept the test database busy)."""
    try:
        with connection.cursor() as cur:
            cur.execute(UNSEND, {"task_ids": [task_id], "node_id": "claimer-test"})
            assert cur.fetchall()
    finally:
        connection.close()


async def _scenario(ids: list[str]) -> list[list[str]]:
    slots = Slots(10)
    pool = make_pool("claimer-test", min_size=1, max_size=1, session=CLAIM_SESSION)
    await pool.open()
    node = SimpleNamespace(claim_pool=pool, settings=SimpleNamespace(node_id="claimer-test"),
                           sessions_for=lambda queue: [slots], unsend=lambda ids: None)
    claimer = Claimer(node)
    passes = []
    try:
        for step in range(4):
            slots.taken, slots.sent = 0, []
            await claimer.claim_queue("floor")
            passes.append(list(slots.sent))
            if step == 0:
                await asyncio.to_thread(_put_back, ids[0])  # behind the floor now
    finally:
        await pool.close()
    return passes


def test_a_task_put_back_behind_the_floor_is_claimed_when_the_backlog_ahead_runs_out(monkeypatch):
    monkeypatch.setattr(claimer_module, "FLOOR_TTL", 60.0)  # however slow the put-back's own connection
    ids = [str(t.id) for t in task_enqueue_many([{"task_name": "t", "queue": "floor"}] * 25)]
    passes = asyncio.run(_scenario(ids))
    assert passes[0] == ids[:10]
    assert passes[1] == ids[10:20]  # after the floor: the put-back task is behind it
    assert passes[2] == ids[20:25] + [ids[0]]  # the backlog ran out: behind the floor too, at once
    assert passes[3] == []


def test_the_floor_lasts_only_floor_ttl(monkeypatch):
    monkeypatch.setattr(claimer_module, "FLOOR_TTL", 0.0)
    ids = [str(t.id) for t in task_enqueue_many([{"task_name": "t", "queue": "floor"}] * 25)]
    passes = asyncio.run(_scenario(ids))
    assert passes[1] == [ids[0]] + ids[10:19]  # from the start of the range again: oldest first


def _gathering_claimer(concurrency: int) -> tuple[Claimer, Slots]:
    slots = Slots(concurrency)
    slots.taken = concurrency  # every slot busy
    node = SimpleNamespace(sessions_for=lambda queue: [slots])
    claimer = Claimer(node)
    claimer._urgent = claimer._everything = False
    return claimer, slots


@pytest.fixture
def gather(monkeypatch) -> float:
    """A longer GATHER than the real 10 ms, so that a busy machine's pauses cannot decide these tests."""
    monkeypatch.setattr(claimer_module, "GATHER", 0.4)
    return claimer_module.GATHER


def test_a_claim_for_freed_slots_waits_until_a_quarter_are_free(gather):
    async def scenario() -> tuple[float, float]:
        claimer, slots = _gathering_claimer(16)
        loop = asyncio.get_running_loop()

        async def results() -> float:
            for _ in range(4):  # the fourth makes a quarter of the 16 slots free
                await asyncio.sleep(0.001)
                slots.taken -= 1
                claimer.freed("q")
                if slots.taken == 15:
                    assert not claimer._wake.is_set()  # one freed slot does not end the wait
            return loop.time()

        started = loop.time()
        claimer.freed("q")
        gather = asyncio.ensure_future(claimer._gather())
        quarter_free_at = await results()
        await gather
        return loop.time() - quarter_free_at, loop.time() - started

    after_quarter, waited = asyncio.run(scenario())
    assert after_quarter < gather / 2
    assert waited < gather


def test_a_claim_for_freed_slots_waits_gather_at_most_and_a_new_task_ends_the_wait(gather):
    async def scenario() -> tuple[float, float]:
        claimer, slots = _gathering_claimer(16)
        loop = asyncio.get_running_loop()
        slots.taken -= 1
        claimer.freed("q")
        started = loop.time()
        await claimer._gather()  # nothing more comes back
        alone = loop.time() - started

        slots.taken -= 1
        claimer.freed("q")
        gather = asyncio.ensure_future(claimer._gather())
        await asyncio.sleep(0)
        started = loop.time()
        claimer.wake("q")  # a new task
        await gather
        return alone, loop.time() - started

    alone, woken = asyncio.run(scenario())
    assert gather * 0.9 <= alone < gather * 5
    assert woken < gather / 2
