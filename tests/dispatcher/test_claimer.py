"""The claimer's floor: during a backlog claims start after the last task claimed, and a task put
back behind the floor is still claimed, at once when the backlog ahead of it runs out."""

import asyncio

import pytest
from django.db import connection

from dispatcher.claimer import Claimer, ClaimerSettings
from dispatcher.controls import Control
from dispatcher.session import InFlight, SessionRegistry, WorkerSession
from dispatcher.sql import CLAIM_SESSION, UNSEND
from tasks.services import task_enqueue_many
from valka.db import make_pool

pytestmark = pytest.mark.django_db(transaction=True)


class Slots(WorkerSession):
    """A worker session with `concurrency` slots that records the tasks it was sent."""

    def __init__(self, concurrency: int) -> None:
        super().__init__(worker_id="w", name="w", queues=("floor", "q"), concurrency=concurrency, session_id="s")
        self.sent: list[str] = []

    @property
    def taken(self) -> int:
        return len(self.in_flight)

    @taken.setter
    def taken(self, n: int) -> None:
        """Hold `n` slots and free the rest, as if `n` assignments were out."""
        self.in_flight = {str(i): InFlight(task_id=str(i), run_id=str(i), queue="q", attempt=1) for i in range(n)}
        self.by_run = {}

    def send(self, message, in_flight=None) -> None:
        if in_flight is not None:
            self.sent.append(in_flight.task_id)


def _claimer(slots: Slots, pool=None, **settings: float) -> Claimer:
    """A claimer on its own: a registry holding `slots`, and `settings` over the defaults."""
    sessions = SessionRegistry()
    sessions.add(slots)
    return Claimer(pool=pool, sessions=sessions, unsend=lambda ids: None,
                   settings=ClaimerSettings(node_id="claimer-test", poll_interval=1, **settings))


def _put_back(task_id: str) -> None:
    """Unsent, as when its worker's stream broke: PENDING again, with its old due time. Runs in a
    thread of its own, whose connection it closes (left open, it kept the test database busy)."""
    try:
        with connection.cursor() as cur:
            cur.execute(UNSEND, {"task_ids": [task_id], "node_id": "claimer-test"})
            assert cur.fetchall()
    finally:
        connection.close()


async def _scenario(ids: list[str], floor_ttl: float) -> list[list[str]]:
    slots = Slots(10)
    pool = make_pool("claimer-test", min_size=1, max_size=1, session=CLAIM_SESSION)
    await pool.open()
    claimer = _claimer(slots, pool, floor_ttl=floor_ttl)
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


def test_a_task_put_back_behind_the_floor_is_claimed_when_the_backlog_ahead_runs_out():
    ids = [str(t.id) for t in task_enqueue_many([{"task_name": "t", "queue": "floor"}] * 25)]
    passes = asyncio.run(_scenario(ids, floor_ttl=60.0))  # however slow the put-back's own connection
    assert passes[0] == ids[:10]
    assert passes[1] == ids[10:20]  # after the floor: the put-back task is behind it
    assert passes[2] == ids[20:25] + [ids[0]]  # the backlog ran out: behind the floor too, at once
    assert passes[3] == []


def test_the_floor_lasts_only_floor_ttl():
    ids = [str(t.id) for t in task_enqueue_many([{"task_name": "t", "queue": "floor"}] * 25)]
    passes = asyncio.run(_scenario(ids, floor_ttl=0.0))
    assert passes[1] == [ids[0]] + ids[10:19]  # from the start of the range again: oldest first


# A longer gather than the real 10 ms, so that a busy machine's pauses cannot decide these tests.
GATHER = 0.4


def _gathering_claimer(concurrency: int) -> tuple[Claimer, Slots]:
    slots = Slots(concurrency)
    slots.taken = concurrency  # every slot busy
    claimer = _claimer(slots, gather=GATHER)
    claimer._urgent = claimer._everything = False
    return claimer, slots


@pytest.fixture
def gather() -> float:
    return GATHER


@pytest.mark.parametrize(("limited", "enough"), [(False, 4), (True, 8)], ids=["open: a quarter", "limited: half"])
def test_a_claim_for_freed_slots_waits_until_enough_are_free(gather, limited, enough):
    async def scenario() -> tuple[float, float]:
        claimer, slots = _gathering_claimer(16)
        if limited:  # a queue with controls: its claim's cost is mostly the same whatever its size
            claimer.controls.known({"q": Control(paused=False, resumes_at=None, limited=True, rated=False)})
        loop = asyncio.get_running_loop()

        async def results() -> float:
            for _ in range(enough):  # the last of them makes enough of the 16 slots free
                await asyncio.sleep(0.001)
                slots.taken -= 1
                claimer.freed("q")
                if slots.taken > 16 - enough:
                    assert not claimer._wake.is_set()  # fewer freed slots do not end the wait
            return loop.time()

        started = loop.time()
        claimer.freed("q")
        gather = asyncio.ensure_future(claimer._gather())
        enough_free_at = await results()
        await gather
        return loop.time() - enough_free_at, loop.time() - started

    after_enough, waited = asyncio.run(scenario())
    assert after_enough < gather / 2
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
