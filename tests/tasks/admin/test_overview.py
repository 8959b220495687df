"""The overview page and the bounded queries behind it (tasks.dashboard)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tasks import dashboard
from tasks.models import Task
from tasks.sql import maintenance
from tests.factories import TaskFactory, TaskRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db


def finish(task, status="COMPLETED"):
    """A real status change (an UPDATE), so the counter trigger sees it."""
    Task.objects.filter(id=task.id).update(status=status, finished_at=timezone.now())


def test_overview_counts_lag_workers_and_chart(admin_client):
    old = timezone.now() - timedelta(minutes=5)
    TaskFactory.create_batch(3, queue="emails", run_at=old)
    TaskFactory(queue="reports", status="FAILED")
    worker = WorkerFactory(concurrency=4)
    TaskRunFactory(worker_id=worker.id, task__queue="emails")
    WorkerFactory(status="DISCONNECTED")
    finish(TaskFactory(queue="emails", status="RUNNING"))
    finish(TaskFactory(queue="emails", status="RUNNING"), "FAILED")

    r = admin_client.get("/admin/")
    assert r.status_code == 200
    overview = r.context["overview"]
    rows = {row["queue"]: {c["status"]: c["n"] for c in row["cells"]} for row in overview["rows"]}
    assert rows["emails"]["PENDING"] == 3 and rows["emails"]["RUNNING"] == 1
    assert rows["emails"]["COMPLETED"] == 1 and rows["emails"]["FAILED"] == 1 and rows["reports"]["FAILED"] == 1
    lag = {row["queue"]: row["lag"] for row in overview["rows"]}
    assert lag["emails"] == "5 min" and lag["reports"] == "—"
    assert [w["id"] for w in overview["workers"]] == [worker.id]
    assert overview["slots"] == {"total": 4, "free": 3}
    assert overview["chart"]["totals"] == {"completed": 1, "failed": 1, "dead_lettered": 0}
    html = r.content.decode()
    assert "/admin/tasks/task/?queue=emails&amp;status__exact=PENDING" in html
    assert 'class="vk-chart"' in html and "<rect" in html
    assert "Tasks" in html  # the app list is still there, below the overview


def test_overview_needs_task_view_permission(staff_client):
    r = staff_client().get("/admin/")
    assert r.status_code == 200 and "overview" not in r.context


def test_overview_shows_an_estimate_for_a_capped_count(monkeypatch):
    TaskFactory.create_batch(3, queue="busy")
    monkeypatch.setattr(dashboard, "COUNT_CAP", 2)
    (row,) = dashboard.overview()["rows"]
    pending = next(c for c in row["cells"] if c["status"] == "PENDING")
    assert pending["n"] == 2 and pending["label"].startswith("≈")
    assert dashboard.compact(950) == "950" and dashboard.compact(9_800) == "9.8k"
    assert dashboard.compact(198_000) == "198k" and dashboard.compact(1_200_000) == "1.2M"


def test_queue_lag_reads_the_oldest_due_task_across_priorities():
    now = timezone.now()
    TaskFactory(queue="a", priority=5, run_at=now - timedelta(seconds=60))
    TaskFactory(queue="a", priority=0, run_at=now - timedelta(seconds=600))
    TaskFactory(queue="a", priority=9, run_at=now + timedelta(hours=1))  # not due: no lag
    TaskFactory(queue="a", priority=0, run_at=now - timedelta(seconds=900), status="COMPLETED")
    TaskFactory(queue="b", run_at=now + timedelta(minutes=1))
    lag = dashboard.queue_lag(now=now)
    assert lag["a"] == pytest.approx(600, abs=0.01)
    assert lag["b"] is None


def test_status_counts_are_capped_and_distinct_values_use_the_index():
    TaskFactory.create_batch(5, queue="big")
    TaskFactory(queue="small", status="RETRY")
    assert dashboard.status_counts(cap=3) == {"big": {"PENDING": 3}, "small": {"RETRY": 1}}
    assert dashboard.status_counts(cap=None, statuses=["RETRY"]) == {"small": {"RETRY": 1}}
    assert dashboard.queue_names() == ["big", "small"]
    assert dashboard.distinct_values(table="tasks", column="task_name", limit=2) == sorted(
        Task.objects.values_list("task_name", flat=True))[:2]


def test_throughput_comes_from_the_counter_trigger_and_survives_folding():
    with connection.cursor() as cursor:  # no counts left by earlier tests that committed theirs
        cursor.execute("DELETE FROM task_counters")
        cursor.execute("DELETE FROM task_counter_deltas")
    for _ in range(2):
        finish(TaskFactory(queue="q", status="RUNNING"))
    finish(TaskFactory(queue="q", status="RETRY"), "DEAD_LETTER")
    series = dashboard.throughput()
    # The last minute's bar (or the last two, when the test straddles a minute boundary).
    recent = {k: series[-1][1][k] + series[-2][1][k] for k in series[-1][1]}
    assert len(series) == 60 and recent == {"completed": 2, "failed": 0, "dead_lettered": 1}
    totals = dashboard.counter_totals()
    assert totals[("q", "created")] == 3 and totals[("q", "completed")] == 2

    # Minutes older than two hours fold into one total row; totals do not change.
    with connection.cursor() as cursor:
        cursor.execute(maintenance.FOLD_COUNTERS)  # as the scheduler's counter fold does
        assert dashboard.counter_totals() == totals
        cursor.execute("UPDATE task_counters SET minute = minute - interval '3 hours'")
        cursor.execute(maintenance.FOLD_COUNTERS)
    assert dashboard.counter_totals() == totals
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT minute::text FROM task_counters")
        assert cursor.fetchall() == [("-infinity",)]
    assert dashboard.throughput()[-1][1]["completed"] == 0


def test_chart_geometry_stacks_kinds_per_minute():
    minute = timezone.now().replace(second=0, microsecond=0)
    chart = dashboard.chart([(minute, {"completed": 3, "failed": 1, "dead_lettered": 0})], width=100, height=40)
    (bar,) = chart["bars"]
    assert chart["top"] == 4 and [s["h"] for s in bar["segments"]] == [30.0, 10.0, 0.0]
    assert bar["segments"][1]["y"] == 0.0 and "3 completed" in bar["title"]


def test_estimated_paginator_counts_small_results_exactly_and_estimates_large_ones():
    TaskFactory.create_batch(8, queue="p")
    TaskFactory.create_batch(2, queue="other")

    class Small(dashboard.EstimatedCountPaginator):
        cap = 5

    assert Small(Task.objects.filter(queue="other"), 50).count == 2
    filtered = Small(Task.objects.filter(queue="p"), 50).count
    assert filtered >= 6  # above the cap: the planner's estimate, never below the cap
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks")
    assert Small(Task.objects.all(), 50).count == 10  # reltuples after ANALYZE
    assert dashboard.EstimatedCountPaginator(Task.objects.all(), 50).count == 10  # small: exact


@pytest.mark.parametrize("seconds,text", [(None, "—"), (0.25, "250 ms"), (12, "12 s"), (600, "10 min"),
                                          (5400, "1.5 h"), (86400 * 3, "3.0 d")])
def test_age_formatting(seconds, text):
    assert dashboard.age(seconds) == text
