"""The claimer and the queues' controls, in process on a real PostgreSQL: it switches claims when a
queue's row changed behind its back, skips paused queues until their pause ends, waits for a rate
window to open, and counts the claims a limit held back."""

import asyncio
from datetime import timedelta

import pytest
from django.db import connection

from dispatcher.claimer import Claimer, ClaimerSettings
from dispatcher.controls import LIMITED, OPEN, PAUSED, QueueControls
from dispatcher.sql import CLAIM_SESSION
from tasks.models import Queue, Task
from tasks.services import task_enqueue_many
from tests.dispatcher.test_claimer import Slots
from tests.helpers import db_now
from valka.db import make_pool

pytestmark = pytest.mark.django_db(transaction=True)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _with_claimer(body, *, concurrency: int = 10, clock=None):
    """Run `body(claimer, slots)` with a claimer on a pool of its own, its controls read first. The
session serves the queues "q" and "floor" (tests.dispatcher.test_claimer.Slots)."""
    pool = make_pool("claimer-controls-test", min_size=1, max_size=1, session=CLAIM_SESSION)
    await pool.open()
    slots = Slots(concurrency)
    from dispatcher.session import SessionRegistry

    sessions = SessionRegistry()
    sessions.add(slots)
    controls = QueueControls(max_age=60.0, **({"clock": clock} if clock else {}))
    claimer = Claimer(pool=pool, sessions=sessions, unsend=lambda ids: None, controls=controls,
                      settings=ClaimerSettings(node_id="controls-test", poll_interval=1, limited_every=0.0))
    try:
        async with pool.connection() as conn:
            await controls.read(conn)
        return await body(claimer, slots)
    finally:
        await pool.close()


def _settings(queue: str, **values) -> None:
    assert Queue.objects.filter(name=queue).update(**values) == 1


def test_a_claimer_that_missed_a_new_limit_claims_nothing_then_claims_within_it():
    task_enqueue_many([{"task_name": "t", "queue": "q"}] * 10)

    async def body(claimer, slots):
        assert claimer.controls.mode("q") == OPEN
        await asyncio.to_thread(_settings, "q", max_running=3)  # no NOTIFY heard
        first = await claimer.claim_queue("q")
        assert claimer.controls.stale() and claimer._wake.is_set(), "it reads the controls again, and retries"
        async with claimer.pool.connection() as conn:
            await claimer.controls.read(conn)
        assert claimer.controls.mode("q") == LIMITED
        return first, await claimer.claim_queue("q"), len(slots.sent)

    assert asyncio.run(_with_claimer(body)) == (0, 3, 3)
    assert Task.objects.filter(status="DISPATCHING").count() == 3


def test_a_paused_queue_is_skipped_until_its_pause_ends_by_itself():
    task_enqueue_many([{"task_name": "t", "queue": "q"}] * 2)
    _settings("q", paused=True, paused_until=db_now() + timedelta(seconds=30))
    clock = Clock()

    async def body(claimer, slots):
        assert claimer.controls.mode("q") == PAUSED
        assert await claimer.claim_queue("q") == 0
        assert 29 < claimer._next_timer() - clock.now <= 30, "it wakes when the pause ends"
        clock.now += 30
        assert claimer.controls.resume_due() == ["q"] and claimer._next_timer() is None
        await asyncio.to_thread(lambda: _settings("q", paused_until=db_now()))  # the database's clock got there too
        return await claimer.claim_queue("q")

    assert asyncio.run(_with_claimer(body, clock=clock)) == 2


def test_a_rate_limited_queue_is_claimed_again_when_its_window_opens():
    task_enqueue_many([{"task_name": "t", "queue": "q"}] * 10)
    _settings("q", rate_limit=4, rate_period_seconds=30)

    def start_them() -> None:
        with connection.cursor() as cur:
            cur.execute("UPDATE tasks SET status = 'RUNNING', started_at = now() WHERE status = 'DISPATCHING'")

    async def body(claimer, slots):
        claimed = await claimer.claim_queue("q")
        await asyncio.to_thread(start_them)
        slots.taken = 0
        again = await claimer.claim_queue("q")
        loop = asyncio.get_running_loop()
        return claimed, again, claimer._retry_at["q"] - loop.time(), len(claimer._waiters)

    claimed, again, retry_in, waiters = asyncio.run(_with_claimer(body))
    assert (claimed, again) == (4, 0)
    assert 29 < retry_in <= 30.5
    assert waiters, "after a claim it waits for the starts, to stamp them"


def test_a_rate_limit_that_unstarted_claims_fill_is_claimed_again_soon():
    """Claims not yet started (another node's, say) fill the window: no stamp says when it opens,
    so the queue is looked at again shortly rather than at the next poll."""
    task_enqueue_many([{"task_name": "t", "queue": "q"}] * 10)
    _settings("q", rate_limit=4, rate_period_seconds=30)

    async def body(claimer, slots):
        loop = asyncio.get_running_loop()
        claimed = await claimer.claim_queue("q")  # four claimed, none started: they fill the window
        waits = [claimer._retry_at["q"] - loop.time()]
        slots.taken = 0
        for _ in range(2):  # still unstarted each time: the wait doubles
            assert await claimer.claim_queue("q") == 0
            waits.append(claimer._retry_at["q"] - loop.time())
        return claimed, waits

    claimed, waits = asyncio.run(_with_claimer(body))
    assert claimed == 4
    assert 0 < waits[0] <= 0.05 and 0.05 < waits[1] <= 0.1 and 0.1 < waits[2] <= 0.2


def test_while_a_running_limit_holds_a_queue_back_a_result_frees_no_slot_until_its_end_is_written():
    task_enqueue_many([{"task_name": "t", "queue": "q"}] * 3)
    _settings("q", max_running=1)

    async def body(claimer, slots):
        claimer._wake.clear()
        claimer.freed("q")
        before_any_claim = claimer._wake.is_set()  # nothing held it back yet: a claim may find room
        assert await claimer.claim_queue("q") == 1  # held back by max_running
        claimer._wake.clear()
        claimer.freed("q")
        held = claimer._wake.is_set()
        claimer.slot_freed("q")  # the NOTIFY the written end sends
        return before_any_claim, held, claimer._wake.is_set()

    assert asyncio.run(_with_claimer(body)) == (True, False, True)


def test_held_back_claims_are_counted_in_the_database():
    task_enqueue_many([{"task_name": "t", "queue": "q"}] * 5)
    _settings("q", max_running=1)

    async def body(claimer, slots):
        for _ in range(3):
            slots.taken = 0
            await claimer.claim_queue("q")
        await claimer._write_limited()

    asyncio.run(_with_claimer(body))
    with connection.cursor() as cur:
        cur.execute("SELECT kind, sum(n) FROM task_counters WHERE queue = 'q' AND kind LIKE 'limited%' GROUP BY kind")
        assert cur.fetchall() == [("limited_max_running", 3)]
