"""The firing loop on a real PostgreSQL, one pass at a time with the clock given (`run_once(now=...)`):
what each slot creates, each catch_up mode after a 5-minute gap, disabled schedules, batches, and
passes repeated or run by two schedulers at once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from schedules.firing import MAX_CATCH_UP, ScheduleFiring
from schedules.models import Schedule
from tasks.models import Task
from tests.helpers import connect, make_config, once, run_async
from tests.schedules.helpers import keys_of, make_schedule, tasks_of

pytestmark = pytest.mark.django_db(transaction=True)

BASE = datetime(2020, 1, 1, 10, 0, tzinfo=UTC)  # a slot of every-minute schedules, in the past


def firing(**config) -> ScheduleFiring:
    return ScheduleFiring(make_config(**config), grace=10.0)


def minutes(*ms: float) -> list[datetime]:
    return [BASE + timedelta(minutes=m) for m in ms]


def test_a_due_slot_creates_its_task_and_the_schedule_moves_on(listen):
    make_schedule("nightly", next_run_at=BASE, input={"day": "today"}, metadata={"team": "ops"}, priority=5,
                  max_retries=1, timeout_seconds=60, queue="reports")
    listener = listen()
    loop = firing()
    assert once(loop, now=BASE - timedelta(seconds=1)) == 0
    assert once(loop, now=BASE + timedelta(seconds=0.4)) == 1

    (task,) = tasks_of("nightly")
    assert task.idempotency_key == "schedule:nightly:2020-01-01T10:00:00Z"
    assert (task.task_name, task.queue, task.input, task.priority, task.max_retries, task.timeout_seconds) == (
        "report", "reports", {"day": "today"}, 5, 1, 60)
    assert task.metadata == {"team": "ops", "valka.schedule": "nightly"}
    assert task.run_at == BASE and task.status == "PENDING"
    assert listener.drain(1) == ["reports"]  # the producer's INSERT woke the dispatchers
    schedule = Schedule.objects.get(name="nightly")
    assert schedule.next_run_at == BASE + timedelta(minutes=1) and schedule.last_run_at == BASE
    assert schedule.last_task_id == task.id and schedule.fired_count == 1
    assert schedule.last_lag_seconds == pytest.approx(0.4)
    assert once(loop, now=BASE + timedelta(seconds=59)) == 0


@pytest.mark.parametrize(("catch_up", "fired"), [
    ("latest", minutes(5)),
    ("none", []),
    ("all", minutes(0, 1, 2, 3, 4, 5)),
])
def test_each_catch_up_mode_after_a_five_minute_gap(catch_up, fired):
    """The scheduler was down from 10:00 to 10:05:30; every slot from 10:00 fell due meanwhile."""
    make_schedule("gap", next_run_at=BASE, catch_up=catch_up)
    assert once(firing(), now=BASE + timedelta(minutes=5, seconds=30)) == len(fired)
    assert [task.run_at for task in tasks_of("gap")] == fired
    schedule = Schedule.objects.get(name="gap")
    assert schedule.next_run_at == BASE + timedelta(minutes=6), "missed or fired, the schedule is on time again"
    assert schedule.fired_count == len(fired)


def test_none_still_fires_a_slot_less_than_the_grace_late():
    make_schedule("punctual", next_run_at=BASE, catch_up="none")
    assert once(firing(), now=BASE + timedelta(minutes=5, seconds=3)) == 1
    assert [task.run_at for task in tasks_of("punctual")] == minutes(5)


def test_all_fires_at_most_the_last_hundred_slots():
    make_schedule("backlog", next_run_at=BASE, catch_up="all")
    assert once(firing(), now=BASE + timedelta(hours=5)) == MAX_CATCH_UP
    runs = [task.run_at for task in tasks_of("backlog")]
    assert runs == [BASE + timedelta(minutes=m) for m in range(300 - MAX_CATCH_UP + 1, 301)]


def test_intervals_fire_on_their_chain():
    make_schedule("ticker", next_run_at=BASE, interval_seconds=20, catch_up="all")
    assert once(firing(), now=BASE + timedelta(seconds=65)) == 4
    assert [task.run_at for task in tasks_of("ticker")] == [BASE + timedelta(seconds=s) for s in (0, 20, 40, 60)]
    assert Schedule.objects.get(name="ticker").next_run_at == BASE + timedelta(seconds=80)


def test_a_disabled_schedule_fires_nothing_and_re_enabling_applies_catch_up():
    make_schedule("paused", next_run_at=BASE, enabled=False)
    loop = firing()
    assert once(loop, now=BASE + timedelta(minutes=5, seconds=30)) == 0
    assert Schedule.objects.get(name="paused").next_run_at == BASE
    Schedule.objects.filter(name="paused").update(enabled=True)
    assert once(loop, now=BASE + timedelta(minutes=5, seconds=30)) == 1  # latest: the 10:05 slot only
    assert [task.run_at for task in tasks_of("paused")] == minutes(5)


def test_a_schedule_past_its_end_stops():
    make_schedule("short", next_run_at=BASE, end_at=BASE + timedelta(minutes=1), catch_up="all")
    assert once(firing(), now=BASE + timedelta(minutes=10)) == 2
    assert Schedule.objects.get(name="short").next_run_at is None
    assert once(firing(), now=BASE + timedelta(minutes=20)) == 0


def test_a_slot_fires_once_however_often_its_batch_runs():
    """A batch run again (next_run_at put back, as after a restore) or by a second scheduler finds
    each slot's key taken: still one task per slot."""
    make_schedule("twice", next_run_at=BASE, catch_up="all")
    loop = firing()
    assert once(loop, now=BASE + timedelta(minutes=2, seconds=1)) == 3
    Schedule.objects.filter(name="twice").update(next_run_at=BASE)
    assert once(loop, now=BASE + timedelta(minutes=3, seconds=1)) == 1  # only 10:03 is new
    assert keys_of("twice") == [f"schedule:twice:2020-01-01T10:0{m}:00Z" for m in range(4)]
    assert Schedule.objects.get(name="twice").fired_count == 4


def test_two_schedulers_at_once_fire_each_slot_once():
    for i in range(1200):
        make_schedule(f"s{i:04}", next_run_at=BASE - timedelta(seconds=i % 7))
    a, b = firing(batch_size=100), firing(batch_size=100)

    async def both() -> list[int]:
        async with await connect() as ca, await connect() as cb:
            return await asyncio.gather(a.run_once(ca, BASE + timedelta(seconds=1)),
                                        b.run_once(cb, BASE + timedelta(seconds=1)))

    made = run_async(both)
    assert sum(made) == 1200 and all(made), made  # both took part
    assert Task.objects.count() == 1200
    assert Task.objects.values("idempotency_key").distinct().count() == 1200
    assert set(Schedule.objects.values_list("next_run_at", flat=True)) == {BASE + timedelta(minutes=1)}


def test_a_batch_locks_its_schedules_and_skips_those_held_elsewhere():
    make_schedule("held", next_run_at=BASE)
    make_schedule("free", next_run_at=BASE)

    async def scenario() -> int:
        async with await connect() as holder, await connect() as conn:
            async with holder.transaction():
                await holder.execute("SELECT 1 FROM schedules WHERE name = 'held' FOR UPDATE")
                return await firing().run_once(conn, BASE + timedelta(seconds=1))

    assert run_async(scenario) == 1
    assert keys_of("free") and not keys_of("held")
    assert Schedule.objects.get(name="held").next_run_at == BASE  # its turn comes next pass
    assert once(firing(), now=BASE + timedelta(seconds=2)) == 1


def test_the_loop_sleeps_until_a_slot_and_wakes_when_a_schedule_is_added():
    """With nothing due it sleeps its whole poll (30 s here); a schedule added meanwhile wakes it through
    the table's trigger, and its first slot fires within a second of its time."""
    from django.db import connections
    from django.utils import timezone

    from schedules import services
    from valka.db import conninfo, make_pool

    def in_thread(fn):
        def call():
            try:
                return fn()
            finally:
                connections.close_all()  # this thread's connection, or the test database stays in use
        return asyncio.to_thread(call)

    pool = make_pool("valka-tests schedules", max_size=2)
    loop = ScheduleFiring(make_config(), pool, listen=conninfo(application_name="valka-tests listen"),
                          poll_interval=30.0)

    async def scenario() -> float:
        stop = asyncio.Event()
        await pool.open()
        running = asyncio.create_task(loop.run(stop))
        try:
            await asyncio.sleep(1.0)  # the loop has looked, found nothing and gone to sleep
            await in_thread(lambda: services.schedule_create(data={
                "name": "woken", "interval_seconds": 2, "task_name": "t", "queue": "q"}))
            due = await in_thread(lambda: Schedule.objects.get(name="woken").next_run_at)
            deadline = asyncio.get_running_loop().time() + 10
            while not await in_thread(lambda: Task.objects.filter(idempotency_key__startswith="schedule:woken:")
                                      .exists()):
                assert asyncio.get_running_loop().time() < deadline, "the schedule never fired"
                await asyncio.sleep(0.02)
            return (timezone.now() - due).total_seconds()
        finally:
            stop.set()
            await asyncio.wait_for(running, 10)
            await pool.close()

    late = run_async(scenario)
    assert 0 <= late < 1.0, f"fired {late:.2f}s after its slot"
