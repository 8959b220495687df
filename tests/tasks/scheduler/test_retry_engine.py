"""The retry engine and dead-letter mover, on a real PostgreSQL."""

from datetime import timedelta

import pytest

from tasks.models import DeadLetter, Task
from tasks.scheduler.base import MIN_SLEEP
from tasks.scheduler.retry import RetryEngine
from tests.factories import TaskFactory
from tests.helpers import connect, db_now, make_config, once, pass_and_sleep, run_async

pytestmark = pytest.mark.django_db(transaction=True)


def status(task) -> str:
    return Task.objects.values_list("status", flat=True).get(id=task.id)


def test_due_retries_become_pending_with_one_notify_per_queue(listen):
    now = db_now()
    a1 = TaskFactory(status="RETRY", queue="alpha", attempt_count=1, run_at=now - timedelta(seconds=2),
                     claimed_by="node-a")
    a2 = TaskFactory(status="RETRY", queue="alpha", attempt_count=2, run_at=now - timedelta(seconds=1))
    b1 = TaskFactory(status="RETRY", queue="beta", attempt_count=1, run_at=now - timedelta(seconds=1))
    later = TaskFactory(status="RETRY", queue="gamma", attempt_count=1, run_at=now + timedelta(hours=1))
    listener = listen()

    assert once(RetryEngine(make_config())) == 3

    assert [status(t) for t in (a1, a2, b1, later)] == ["PENDING", "PENDING", "PENDING", "RETRY"]
    moved = Task.objects.get(id=a1.id)
    assert moved.attempt_count == 1 and moved.claimed_by is None and moved.finished_at is None
    assert sorted(listener.drain(2)) == ["alpha", "beta"]


def test_explicit_now_moves_time_without_sleeping():
    now = db_now()
    task = TaskFactory(status="RETRY", attempt_count=1, run_at=now + timedelta(seconds=30))
    engine = RetryEngine(make_config())
    assert once(engine, now=now) == 0
    assert once(engine, now=now + timedelta(seconds=29)) == 0
    assert status(task) == "RETRY"
    assert once(engine, now=now + timedelta(seconds=30)) == 1
    assert status(task) == "PENDING"


def test_max_retries_boundary():
    """attempt_count == max_retries: one attempt left → PENDING. One more → DEAD_LETTER, even before
    its backoff ends, with exactly one dead-letter row, however often the engine runs."""
    now = db_now()
    last_try = TaskFactory(status="RETRY", attempt_count=3, max_retries=3, run_at=now - timedelta(seconds=1))
    exhausted = TaskFactory(status="RETRY", attempt_count=4, max_retries=3, error_message="boom",
                            run_at=now + timedelta(hours=1))
    never_retry = TaskFactory(status="RETRY", attempt_count=1, max_retries=0, run_at=now - timedelta(seconds=1))
    engine = RetryEngine(make_config())

    assert once(engine) == 3
    assert status(last_try) == "PENDING"
    for task in (exhausted, never_retry):
        dead = Task.objects.get(id=task.id)
        assert dead.status == "DEAD_LETTER" and dead.finished_at is not None
        assert DeadLetter.objects.filter(task_id=task.id).count() == 1
    letter = DeadLetter.objects.get(task_id=exhausted.id)
    assert (letter.error_message, letter.attempt_count, letter.queue) == ("boom", 4, exhausted.queue)

    assert once(engine) == 0
    assert DeadLetter.objects.count() == 2


def test_batches_are_bounded_and_repeated_until_nothing_is_due():
    now = db_now()
    tasks = [TaskFactory(status="RETRY", attempt_count=1, run_at=now - timedelta(seconds=10 - i))
             for i in range(5)]
    engine = RetryEngine(make_config(batch_size=2))

    async def one_batch() -> int:
        async with await connect() as conn, conn.transaction():
            return await engine.promote_batch(conn)

    assert run_async(one_batch) == 2
    # Earliest due first.
    assert [status(t) for t in tasks] == ["PENDING", "PENDING", "RETRY", "RETRY", "RETRY"]
    assert once(engine) == 3
    assert all(status(t) == "PENDING" for t in tasks)


def test_a_task_locked_elsewhere_is_skipped_then_moved():
    now = db_now()
    busy = TaskFactory(status="RETRY", attempt_count=1, run_at=now - timedelta(seconds=1))
    free = TaskFactory(status="RETRY", attempt_count=1, run_at=now - timedelta(seconds=1))
    engine = RetryEngine(make_config())

    async def scenario() -> tuple[int, int]:
        async with await connect() as holder, await connect() as conn:
            async with holder.transaction():
                await holder.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", [busy.id])
                first = await engine.run_once(conn)
            return first, await engine.run_once(conn)

    assert run_async(scenario) == (1, 1)
    assert status(busy) == status(free) == "PENDING"


def test_next_delay_follows_the_earliest_retry():
    engine = RetryEngine(make_config(max_sleep=10.0))

    async def delay() -> float:
        async with await connect() as conn:
            return await engine.next_delay(conn)

    assert run_async(delay) == 10.0  # nothing waits: the bound
    far = TaskFactory(status="RETRY", attempt_count=1, run_at=db_now() + timedelta(hours=1))
    assert run_async(delay) == 10.0
    TaskFactory(status="RETRY", attempt_count=1, run_at=db_now() + timedelta(seconds=5))
    assert 2 < run_async(delay) <= 5.02  # however slow this machine is
    Task.objects.filter(id=far.id).update(run_at=db_now() - timedelta(seconds=5))
    assert run_async(delay) == MIN_SLEEP  # overdue (locked elsewhere, say): a short nap, no spin


def test_an_idle_pass_is_one_statement_and_its_answer_the_sleep():
    """With no task in RETRY the pass asks once and stops: an idle scheduler makes one statement a
    second for this loop. With one waiting, however far off, the pass moves what is due and asks
    again when to wake."""
    engine = RetryEngine(make_config(max_sleep=10.0))
    assert pass_and_sleep(engine) == (10.0, 1)

    TaskFactory(status="RETRY", attempt_count=1, run_at=db_now() + timedelta(hours=1))
    delay, sent = pass_and_sleep(engine)
    assert delay == 10.0 and sent > 1
    exhausted = TaskFactory(status="RETRY", attempt_count=4, max_retries=3, run_at=db_now() + timedelta(hours=1))
    pass_and_sleep(engine)
    assert status(exhausted) == "DEAD_LETTER"  # moved whatever its due time
