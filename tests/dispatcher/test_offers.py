"""Handing a task to a dispatcher in its INSERT: the offers a dispatcher makes (dispatcher/offers.py),
the producer's statement that takes them (tasks/sql/producer.py INSERT_TASK), what the dispatcher
does with a task handed to it (Claimer.handed), and the sweep that puts back one whose NOTIFY was
lost. End to end with real processes in tests/e2e/test_dispatch.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.utils import timezone

from dispatcher import sql
from dispatcher.controls import Control, QueueControls
from dispatcher.offers import OFFER_MAX, Offers
from dispatcher.session import InFlight, SessionRegistry
from dispatcher.sweep import HANDED_GRACE, Sweep
from tasks import offer_misses
from tasks.models import Queue, QueueOffer, Task
from tasks.notify import TASK_READY, handoff_channel
from tasks.scheduler.reaper import LeaseReaper
from tasks.services import task_enqueue
from tasks.specs import parse_task_spec
from tests.dispatcher.test_claimer import Slots, _claimer
from tests.helpers import database_url, make_config, once
from valka.db import make_pool

pytestmark = pytest.mark.django_db(transaction=True)

NODE = "offers-test"
CHANNEL = handoff_channel(NODE)


def _offer(queue: str = "q", slots: int = 2, seconds: float = 60.0) -> None:
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute("INSERT INTO queue_offers (queue, node_id, channel, slots, expires_at) "
                     "VALUES (%s, %s, %s, %s, now() + make_interval(secs => %s))",
                     (queue, NODE, CHANNEL, slots, seconds))


def _slots(queue: str = "q") -> int | None:
    offer = QueueOffer.objects.filter(queue=queue, node_id=NODE).first()
    return offer.slots if offer else None


def test_a_task_inserted_while_a_slot_is_offered_is_handed_to_that_dispatcher(listen):
    _offer(slots=1)
    handed, ready = listen(CHANNEL), listen(TASK_READY)
    task = task_enqueue(task_name="t", queue="q", input={"n": 1}, metadata={"m": "x"}, timeout_seconds=30,
                        priority=4)
    assert (task.status, task.claimed_by) == ("DISPATCHING", NODE)
    row = Task.objects.get(id=task.id)
    assert (row.status, row.claimed_by, row.attempt_count) == ("DISPATCHING", NODE, 0)
    [payload] = handed.drain(1)
    task_id, name, queue, input_text, metadata_text, attempt, timeout, priority, run_at = json.loads(payload)
    assert (task_id, name, queue, attempt, timeout, priority) == (str(task.id), "t", "q", 1, 30, 4)
    assert json.loads(input_text) == {"n": 1} and json.loads(metadata_text) == {"m": "x"} and run_at
    assert _slots() == 0 and ready.drain(0) == []
    later = task_enqueue(task_name="t", queue="q")  # the offer is used up: the usual way
    assert later.status == Task.objects.get(id=later.id).status == "PENDING"
    assert ready.drain(1) == [f"q {later.id}"] and handed.drain(0) == []


def test_just_after_a_miss_a_producer_does_not_look_for_a_slot_of_that_queue(listen, monkeypatch):
    monkeypatch.setattr(offer_misses, "MISS_SECONDS", 0.5)
    ready = listen(TASK_READY)
    task_enqueue(task_name="t", queue="q")  # no slot offered: a miss
    later = task_enqueue(task_name="t", queue="q", run_at="2999-01-01T00:00:00Z")
    _offer(slots=2)
    # Within the half second: inserted PENDING without a look, announced when due now.
    quick = task_enqueue(task_name="t", queue="q")
    assert quick.status == Task.objects.get(id=quick.id).status == "PENDING" and _slots() == 2
    assert task_enqueue(task_name="t", queue="other").status == "PENDING"  # another queue looks
    assert [p.split()[0] for p in ready.drain(3)] == ["q", "q", "other"]
    assert ready.drain(0) == [] and Task.objects.get(id=later.id).status == "PENDING"
    time.sleep(0.5)
    assert task_enqueue(task_name="t", queue="q").status == "DISPATCHING" and _slots() == 1
    # A task handed over leaves no miss behind: the next one looks, and finds the last slot.
    assert task_enqueue(task_name="t", queue="q").status == "DISPATCHING" and _slots() == 0
    assert ready.drain(0) == []


@pytest.mark.parametrize("case", ["due later", "paused queue", "limited queue", "lapsed offer", "other queue"])
def test_no_handoff_unless_the_task_is_due_and_its_queue_free_and_offered(case, listen):
    _offer(seconds=-1 if case == "lapsed offer" else 60)
    if case in ("paused queue", "limited queue"):
        task_enqueue(task_name="t", queue="q", run_at="2999-01-01T00:00:00Z")  # makes the queue's row
        Queue.objects.filter(name="q").update(**{"paused": True} if case == "paused queue" else {"max_running": 3})
    handed = listen(CHANNEL)
    task = task_enqueue(task_name="t", queue="other" if case == "other queue" else "q",
                        run_at="2999-01-01T00:00:00Z" if case == "due later" else None)
    assert task.status == Task.objects.get(id=task.id).status == "PENDING"
    assert handed.drain(0) == [] and _slots() == 2


def test_a_repeated_idempotency_key_takes_no_slot(listen):
    first = task_enqueue(task_name="t", queue="q", idempotency_key="once")  # before any offer
    _offer()
    handed = listen(CHANNEL)
    offer_misses.forget()  # the first one's miss must not spare the second its look at the offer
    again = task_enqueue(task_name="t", queue="q", idempotency_key="once")
    assert again.id == first.id and again.status == "PENDING"
    assert _slots() == 2 and handed.drain(0) == []


@pytest.mark.parametrize("looks", [True, False])
def test_only_a_task_nothing_can_conflict_with_skips_the_conflict_check(looks, monkeypatch):
    """A task with neither id nor key takes the INSERT without ON CONFLICT; one with either keeps
    the check, so a repeat finds the task that holds them, whether the producer looks for a slot
    or not (just after a miss)."""
    monkeypatch.setattr(offer_misses, "MISS_SECONDS", 0.0 if looks else 60.0)
    first = task_enqueue(task_name="t", queue="q", idempotency_key="k")  # no slot offered: a miss
    made = task_enqueue(task_name="t", queue="q", id="0193a1b2-0000-7000-8000-000000000001")
    specs = {name: parse_task_spec({"task_name": "t", "queue": "q", **extra}) for name, extra in
             (("new", {}), ("key", {"idempotency_key": "k"}), ("id", {"id": str(made.id)}))}
    chosen = {name: offer_misses.statement(spec) for name, spec in specs.items()}
    assert ["ON CONFLICT" in chosen[name] for name in ("new", "key", "id")] == [False, True, True]
    assert ["queue_offers" in chosen[name] for name in ("new", "key", "id")] == [looks] * 3
    assert task_enqueue(task_name="t", queue="q", idempotency_key="k").id == first.id
    assert task_enqueue(task_name="t", queue="q", id=str(made.id)).id == made.id
    fresh = [task_enqueue(task_name="t", queue="q") for _ in range(2)]
    assert len({t.id for t in fresh}) == 2
    assert Task.objects.filter(queue="q").count() == 4


def test_a_producer_never_waits_for_an_offer_another_producer_holds(listen):
    """A producer whose transaction is open holds the offer's row: the others insert PENDING, at
    once, and the dispatcher's write of its offer skips the row rather than wait."""
    _offer()
    holder = psycopg.connect(database_url())
    try:
        holder.execute("SELECT 1 FROM queue_offers WHERE node_id = %s FOR UPDATE", (NODE,))
        began = time.monotonic()
        task = task_enqueue(task_name="t", queue="q")
        assert task.status == "PENDING" and time.monotonic() - began < 2

        async def offer() -> int:
            pool = make_pool("offers-test", min_size=1, max_size=1, session=sql.CLAIM_SESSION)
            await pool.open()
            try:
                return await Offers(pool=pool, node_id=NODE, channel=CHANNEL).update({"q": 5})
            finally:
                await pool.close()

        began = time.monotonic()
        assert asyncio.run(offer()) == 0 and time.monotonic() - began < 2
    finally:
        holder.close()
    assert _slots() == 2


def test_a_task_too_large_for_a_notify_is_announced_by_its_id(listen):
    _offer()
    handed = listen(CHANNEL)
    task = task_enqueue(task_name="t", queue="q", input={"blob": "x" * 10_000})
    assert task.status == "DISPATCHING"
    assert json.loads(handed.drain(1)[0]) == [str(task.id), "q"]
    with psycopg.connect(database_url(), autocommit=True) as conn:
        [row] = conn.execute(sql.HANDED_TASK, {"task_id": str(task.id), "node_id": NODE}).fetchall()
    assert row[0] == str(task.id) and json.loads(row[3]) == {"blob": "x" * 10_000}


def _run_offers(steps) -> list[int | None]:
    """Run `steps(offers)` (async) on one Offers; the row's slots after each."""
    async def scenario() -> list[int | None]:
        pool = make_pool("offers-test", min_size=1, max_size=1, session=sql.CLAIM_SESSION)
        await pool.open()
        offers = Offers(pool=pool, node_id=NODE, channel=CHANNEL)
        seen = []
        try:
            for step in steps:
                await step(offers)
                seen.append(await asyncio.to_thread(_slots_in_thread))
        finally:
            await pool.close()
        return seen

    return asyncio.run(scenario())


def _slots_in_thread() -> int | None:
    with psycopg.connect(database_url(), autocommit=True) as conn:
        row = conn.execute("SELECT slots FROM queue_offers WHERE node_id = %s AND queue = 'q'", (NODE,)).fetchone()
    return row[0] if row else None


def test_an_offer_is_written_again_once_half_of_it_is_taken_and_withdrawn_at_once():
    async def offer_four(offers: Offers) -> None:
        assert await offers.update({"q": 4}) == 1

    async def take_one(offers: Offers) -> None:
        offers.took("q")
        assert await offers.update({"q": 4}) == 0  # three left: enough

    async def take_another(offers: Offers) -> None:
        offers.took("q")
        assert await offers.update({"q": 4}) == 1  # two left of four: offered again

    async def withdraw(offers: Offers) -> None:
        assert await offers.update({}) == 1 and offers.offered("q") == 0

    async def stop(offers: Offers) -> None:
        await offers.update({"q": 4})
        await offers.withdraw_all()

    with psycopg.connect(database_url(), autocommit=True) as conn:  # a dispatcher gone two minutes
        conn.execute("INSERT INTO queue_offers VALUES ('q', 'gone', 'c', 3, now() - interval '2 minutes')")
    # The row keeps what was written; a producer's takes are its own (none here).
    assert _run_offers([offer_four, take_one, take_another, withdraw, stop]) == [4, 4, 4, 0, None]
    assert not QueueOffer.objects.filter(node_id="gone").exists(), "dropped at the first write"


def _handed(claimer, queue: str = "q", task_id: str = "0197c5a2-5b1e-7000-8000-000000000001") -> str:
    claimer.handed(json.dumps([task_id, "t", queue, "{}", "{}", 1, 300, 0, "2026-01-01T00:00:00+00:00"]))
    return task_id


@pytest.mark.parametrize("case", ["free", "no free slot", "stopped", "controls unknown", "paused"])
def test_the_dispatcher_sends_a_task_handed_to_it_or_puts_it_back(case):
    put_back: list[str] = []

    async def scenario() -> tuple[str, list[str]]:
        slots = Slots(1)
        claimer = _claimer(slots)
        claimer.unsend = put_back.extend
        claimer.controls = QueueControls(max_age=60)
        claimer.controls.known({})  # read: no queue has controls
        if case == "no free slot":
            slots.taken = 1
        elif case == "stopped":
            claimer.stopped = True
        elif case == "controls unknown":
            claimer.controls.forget()
        elif case == "paused":
            claimer.controls.known({"q": _paused()})
        return _handed(claimer), slots.sent

    task_id, sent = asyncio.run(scenario())
    if case == "free":
        assert sent == [task_id] and put_back == []
    else:
        assert put_back == [task_id] and sent == []


def _paused() -> Control:
    return Control(paused=True, resumes_at=None, limited=False, rated=False)


def test_a_dispatcher_offers_the_free_slots_of_its_drained_queues_without_controls():
    async def scenario() -> None:
        slots = Slots(OFFER_MAX + 4)
        claimer = _claimer(slots)
        claimer.controls = QueueControls(max_age=60)
        assert claimer._offerable() == {}  # the controls were never read
        claimer.controls.known({})
        assert claimer._offerable() == {}  # no claim came back short yet: there may be a backlog
        claimer._drained = {"q", "floor"}
        assert claimer._offerable() == {"q": OFFER_MAX, "floor": OFFER_MAX}
        slots.taken = OFFER_MAX + 1
        claimer.controls.known({"floor": _paused()})
        assert claimer._offerable() == {"q": 3}

    asyncio.run(scenario())


def test_the_sweep_puts_back_a_task_handed_over_whose_notify_was_lost():
    """Only the first: the second is held by a session, and the third was sent and its result came
    back (its session let it go) while its start waits in a slow writer's buffer."""
    _offer(slots=3)
    unheard = task_enqueue(task_name="t", queue="q")
    held = task_enqueue(task_name="t", queue="q")
    starting = task_enqueue(task_name="t", queue="q")
    assert unheard.status == held.status == starting.status == "DISPATCHING"
    Task.objects.filter(id__in=[unheard.id, held.id, starting.id]).update(
        updated_at=timezone.now() - timedelta(seconds=HANDED_GRACE + 1))
    put_back: list[str] = []

    async def scenario() -> int:
        sessions = SessionRegistry()
        slots = Slots(4)
        slots.in_flight = {str(held.id): InFlight(task_id=str(held.id), run_id="r", queue="q", attempt=1)}
        sessions.add(slots)
        pool = make_pool("offers-test", min_size=1, max_size=1)
        await pool.open()
        try:
            sweep = Sweep(pool=pool, sessions=sessions, relay=None, interval=60,  # type: ignore[arg-type]
                          unsend=put_back.extend, node_id=NODE, offered=lambda: {"q"},
                          starting=lambda: {str(starting.id)})
            return await sweep.put_back_unheard()
        finally:
            await pool.close()

    assert asyncio.run(scenario()) == 1 and put_back == [str(unheard.id)]


def test_after_a_reconnect_the_sweep_puts_back_a_task_handed_over_just_before_it():
    """Handed over while PostgreSQL was back and the LISTEN connection not yet: too young for the
    look at the reconnect, put back by the look that follows it, not at the next interval (60 s)."""
    _offer(slots=1)
    task = task_enqueue(task_name="t", queue="q")
    assert task.status == "DISPATCHING"
    put_back: list[str] = []

    async def scenario() -> None:
        pool = make_pool("offers-test", min_size=1, max_size=1)
        await pool.open()
        stop = asyncio.Event()
        sweep = Sweep(pool=pool, sessions=SessionRegistry(), relay=None, interval=60,  # type: ignore[arg-type]
                      unsend=put_back.extend, node_id=NODE, offered=lambda: {"q"})
        runner = asyncio.create_task(sweep.run(stop))
        try:
            sweep.reconnected()
            began = time.monotonic()
            while not put_back and time.monotonic() - began < HANDED_GRACE + 10:
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            sweep.wake()
            await runner
            await pool.close()

    asyncio.run(scenario())
    assert put_back == [str(task.id)]


def test_two_producers_at_once_take_the_last_slot_once():
    _offer(slots=1)
    results: list[str] = []
    barrier = threading.Barrier(2)

    def produce() -> None:
        from django.db import connection

        try:
            barrier.wait()
            results.append(task_enqueue(task_name="t", queue="q").status)
        finally:
            connection.close()

    threads = [threading.Thread(target=produce) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["DISPATCHING", "PENDING"] and _slots() == 0


def test_a_task_handed_to_a_dispatcher_that_died_goes_back_to_pending_like_a_claimed_one():
    """The offer outlived its dispatcher (it lapses within seconds): the task handed over is
    DISPATCHING for a node that will never send it, and the lease reaper puts it back."""
    _offer()
    task = task_enqueue(task_name="t", queue="q")
    assert task.status == "DISPATCHING"
    Task.objects.filter(id=task.id).update(updated_at=timezone.now() - timedelta(seconds=61))
    assert once(LeaseReaper(make_config(dispatching_timeout=60))) == 1
    row = Task.objects.get(id=task.id)
    assert (row.status, row.claimed_by, row.attempt_count) == ("PENDING", None, 0)
