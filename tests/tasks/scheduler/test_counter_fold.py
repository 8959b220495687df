"""The counter fold moves the counts the triggers append into their minutes and folds old minutes,
and the readers count the same before and after it."""

import pytest
from django.db import connection

from tasks import dashboard
from tasks.scheduler.counters import CounterFold
from tests.factories import TaskFactory
from tests.helpers import make_config, once

pytestmark = pytest.mark.django_db(transaction=True)

CREATED = "SELECT minute::text, n FROM task_counters WHERE kind = 'created' AND queue = 'folded' ORDER BY minute"


def _deltas(queue: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM task_counter_deltas WHERE queue = %s", [queue])
        return cursor.fetchone()[0]


def test_appended_counts_are_moved_old_minutes_folded_and_totals_kept():
    """The scheduler folds the throughput counters, so /metrics and the overview never write."""
    TaskFactory(queue="folded")
    TaskFactory(queue="folded")
    assert _deltas("folded") == 2  # one row appended per statement, nothing in task_counters yet
    with connection.cursor() as cursor:
        cursor.execute(CREATED)
        assert cursor.fetchall() == []
        cursor.execute("UPDATE task_counter_deltas SET minute = date_trunc('minute', now()) - interval '3 hours' "
                       "WHERE queue = 'folded'")
        TaskFactory(queue="folded")  # this minute's: kept as it is
        assert once(CounterFold(make_config())) >= 2
        cursor.execute(CREATED)
        rows = cursor.fetchall()
    assert rows[0] == ("-infinity", 2) and [n for _, n in rows[1:]] == [1]
    assert _deltas("folded") == 0
    assert once(CounterFold(make_config())) == 0  # nothing left to move or fold


def test_the_readers_count_the_deltas_before_the_fold_as_after_it():
    TaskFactory.create_batch(3, queue="read")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks SET status = 'CANCELLED', finished_at = now() WHERE queue = 'read'")
    before = dashboard.counter_totals()
    chart_before = dashboard.throughput(minutes=5, kinds=("created", "cancelled"))
    assert before[("read", "created")] == 3 and before[("read", "cancelled")] == 3
    assert sum(counts["created"] for _, counts in chart_before) >= 3
    once(CounterFold(make_config()))
    assert _deltas("read") == 0
    assert dashboard.counter_totals() == before
    assert dashboard.throughput(minutes=5, kinds=("created", "cancelled")) == chart_before
