"""The delayed promoter: one NOTIFY per queue when scheduled tasks fall due, each announced once."""

from datetime import timedelta

import pytest
from django.db import connection

from tasks.scheduler.promoter import LOOKBACK_SECONDS, DelayedPromoter
from tasks.sql import maintenance
from tests.factories import TaskFactory
from tests.helpers import connect, db_now, make_config, once, pass_and_sleep, run_async
from tests.plans import executed_plan, nodes, outline

pytestmark = pytest.mark.django_db(transaction=True)


def test_delayed_tasks_are_announced_once_when_they_fall_due(listen):
    t0 = db_now()
    TaskFactory(queue="alpha", run_at=t0 + timedelta(seconds=10))
    TaskFactory(queue="alpha", run_at=t0 + timedelta(seconds=12))
    TaskFactory(queue="beta", run_at=t0 + timedelta(seconds=11))
    TaskFactory(queue="gamma", run_at=t0 + timedelta(hours=1))
    TaskFactory(queue="cancelled", status="CANCELLED", run_at=t0 + timedelta(seconds=10))
    TaskFactory(queue="immediate")  # due at creation: its producer announced it
    promoter = DelayedPromoter(make_config())
    listener = listen()

    assert once(promoter, now=t0) == 0
    assert promoter.watermark == t0
    assert once(promoter, now=t0 + timedelta(seconds=11)) == 2  # alpha at 10 s, beta at 11 s
    assert sorted(listener.drain(2)) == ["alpha", "beta"]
    assert once(promoter, now=t0 + timedelta(seconds=15)) == 1  # the second alpha, at 12 s
    assert listener.drain(1) == ["alpha"]
    assert once(promoter, now=t0 + timedelta(seconds=15)) == 0  # nothing twice
    assert listener.drain(0) == []
    assert once(promoter, now=t0 + timedelta(hours=2)) == 1
    assert listener.drain(1) == ["gamma"]


def test_a_claimed_task_is_not_announced():
    t0 = db_now()
    TaskFactory(queue="alpha", status="DISPATCHING", run_at=t0 + timedelta(seconds=5))
    promoter = DelayedPromoter(make_config())
    promoter.watermark = t0
    assert once(promoter, now=t0 + timedelta(seconds=10)) == 0


def test_first_pass_looks_back_for_what_a_previous_leader_missed(listen):
    t0 = db_now()
    TaskFactory(queue="recent", run_at=t0 - timedelta(seconds=LOOKBACK_SECONDS / 2),
                created_at=t0 - timedelta(seconds=LOOKBACK_SECONDS))
    TaskFactory(queue="ancient", run_at=t0 - timedelta(seconds=LOOKBACK_SECONDS * 2),
                created_at=t0 - timedelta(seconds=LOOKBACK_SECONDS * 3))
    promoter = DelayedPromoter(make_config())
    listener = listen()
    assert once(promoter, now=t0) == 1
    assert listener.drain(1) == ["recent"]
    promoter.reset()
    assert once(promoter, now=t0) == 1  # a new term looks back again


def test_next_delay_follows_the_next_scheduled_task():
    promoter = DelayedPromoter(make_config(max_sleep=10.0))

    async def delay() -> float:
        async with await connect() as conn:
            return await promoter.next_delay(conn)

    assert run_async(delay) == 10.0
    TaskFactory(run_at=db_now() + timedelta(hours=1))
    assert run_async(delay) == 10.0
    TaskFactory(run_at=db_now() + timedelta(seconds=5))
    assert 2 < run_async(delay) <= 5.02  # however slow this machine is


def test_a_pass_says_when_to_wake_without_a_statement_of_its_own():
    """The pass's statement also answers when the next delayed task falls due: on an autocommit
    connection the pass and its sleep are that one statement, and the sleep is the one
    NEXT_DELAYED_DUE gives."""
    promoter = DelayedPromoter(make_config(max_sleep=10.0))
    assert pass_and_sleep(promoter) == (10.0, 1)
    TaskFactory(run_at=db_now() + timedelta(seconds=5))
    delay, sent = pass_and_sleep(promoter)
    assert 2 < delay <= 5.02 and sent == 1


def test_the_next_due_time_reads_one_entry_of_many_delayed_tasks():
    """10,000 tasks scheduled for later: the pass's look for the next one reads the delayed index's
    first entry past now, not every task after it (a min over an expression of run_at would)."""
    with connection.cursor() as cur:
        cur.execute("""
            INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count, timeout_seconds,
                               metadata, run_at, created_at, updated_at)
            SELECT gen_random_uuid(), 'later', 'q', 'PENDING', 0, 3, 0, 300, '{}',
                   now() + make_interval(secs => 60 + g), now(), now()
            FROM generate_series(1, 10000) g""")
        cur.execute("ANALYZE tasks")
    params = {"now": None, "since": None, "lookback": LOOKBACK_SECONDS}
    with connection.cursor() as cur:
        cur.execute(maintenance.DUE_DELAYED, params)
        assert 55 < cur.fetchone()[4] <= 61  # the first of them, 61 s after the statement's now
    plan = executed_plan(maintenance.DUE_DELAYED, params, generic=False)
    read = [n for n in nodes(plan) if n.get("Relation Name") == "tasks"]
    assert read and sum(n["Actual Rows"] * n["Actual Loops"] for n in read) <= 1, outline(plan)
