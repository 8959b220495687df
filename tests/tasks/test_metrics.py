"""GET /metrics: computed from the database at most once per VALKA_METRICS_CACHE_SECONDS per process,
without a write, public unless configured otherwise, and label values (queue names, which rows from
elsewhere could make hostile) quoted."""

import threading
import urllib.request
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from dispatcher.sql import RECORD_LIMITED
from tasks.metrics import exposition
from tasks.models import Queue, Task, TaskRun
from tests.factories import TaskFactory, TaskRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh():
    """Each test computes its own figures: none left from an earlier test's scrape."""
    exposition.forget()


def metrics(client, **headers):
    r = client.get("/metrics", **headers)
    assert r.status_code == 200 and r["Content-Type"].startswith("text/plain")
    return {s.name + repr(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(r.content.decode()) for s in family.samples}


def test_metrics_are_computed_from_the_database(client):
    now = timezone.now()
    TaskFactory.create_batch(2, queue="emails", run_at=now - timedelta(seconds=30))
    WorkerFactory()
    WorkerFactory(status="DISCONNECTED")
    # one dispatched 2 s after it was due, one that ran 3 s and completed
    TaskRunFactory(task__run_at=now - timedelta(seconds=2), task__queue="emails")
    done = TaskRunFactory(task__queue="emails", task__attempt_count=1)
    TaskRun.objects.filter(id=done.id).update(status="COMPLETED", started_at=now - timedelta(seconds=3),
                                              finished_at=now)
    Task.objects.filter(id=done.task_id).update(status="COMPLETED", finished_at=now)
    Task.objects.filter(id=TaskFactory(queue="emails", status="RETRY").id).update(status="DEAD_LETTER",
                                                                                  finished_at=now)
    m = metrics(client)
    assert m["valka_tasks[('queue', 'emails'), ('status', 'PENDING')]"] == 2
    assert m["valka_tasks[('queue', 'emails'), ('status', 'RUNNING')]"] == 1
    assert not any("COMPLETED" in key for key in m if key.startswith("valka_tasks["))
    assert m["valka_queue_lag_seconds[('queue', 'emails')]"] == pytest.approx(30, abs=5)
    assert m["valka_workers_connected[]"] == 1
    assert m["valka_tasks_created_total[('queue', 'emails')]"] == 5
    assert m["valka_tasks_completed_total[('queue', 'emails')]"] == 1
    assert m["valka_tasks_dead_lettered_total[('queue', 'emails')]"] == 1
    latency = "valka_dispatch_latency_seconds_bucket[('le', '{}')]"
    assert m[latency.format("1.0")] < m[latency.format("2.5")]
    duration = "valka_run_duration_seconds_bucket[('le', '{}')]"
    assert (m[duration.format("2.5")], m[duration.format("5.0")], m[duration.format("+Inf")]) == (0, 1, 1)
    assert m["valka_run_duration_seconds_gsum[]"] == pytest.approx(3, abs=0.01)


def test_queue_metrics_come_from_the_database(client):
    TaskFactory(queue="paused", status="PENDING")
    TaskFactory(queue="busy", status="RUNNING")
    TaskFactory(queue="busy", status="DISPATCHING")
    Queue.objects.filter(name="paused").update(paused=True)
    with connection.cursor() as cursor:  # as the dispatchers record them (dispatcher/sql.py RECORD_LIMITED)
        cursor.execute(RECORD_LIMITED, {"queues": ["busy", "busy", "busy"], "counts": [3, 2, 1],
                                        "reasons": ["max_running", "rate_limit", "max_running"]})
    m = metrics(client)
    assert m["valka_queue_paused[('queue', 'paused')]"] == 1
    assert m["valka_queue_paused[('queue', 'busy')]"] == 0
    assert m["valka_queue_running[('queue', 'busy')]"] == 2
    assert m["valka_queue_running[('queue', 'paused')]"] == 0
    assert m["valka_queue_limited_total[('queue', 'busy'), ('reason', 'max_running')]"] == 4
    assert m["valka_queue_limited_total[('queue', 'busy'), ('reason', 'rate_limit')]"] == 2
    assert not any(key.startswith("valka_tasks_limited") for key in m)


def test_metrics_can_require_authentication(client, admin_client, api_key, staff_client):
    with override_settings(VALKA={**settings.VALKA, "METRICS_PUBLIC": False}):
        r = client.get("/metrics")
        assert r.status_code == 401 and r["WWW-Authenticate"] == "Bearer"
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer vk_wrong").status_code == 401
        metrics(client, HTTP_AUTHORIZATION=f"Bearer {api_key}")
        metrics(admin_client)
        metrics(staff_client("tasks.view_task"))
        assert staff_client().get("/metrics").status_code == 401  # staff that may not see tasks


def test_metrics_quote_hostile_queue_names(client):
    # Written around the API's queue validator, as rows from elsewhere could be.
    for queue in ['a"b', "line\nbreak", "back\\slash", "x'; DROP TABLE tasks; --"]:
        TaskFactory(queue=queue)
    r = client.get("/metrics")
    assert r.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(r.content.decode())}
    queues = {s.labels["queue"] for s in families["valka_tasks"].samples}
    assert {'a"b', "line\nbreak", "back\\slash", "x'; DROP TABLE tasks; --"} <= queues


def test_a_burst_of_scrapes_costs_one_computation(client):
    TaskFactory(queue="emails")
    computed = exposition.computed
    with CaptureQueriesContext(connection) as first:
        assert metrics(client)["valka_tasks[('queue', 'emails'), ('status', 'PENDING')]"] == 1
    assert first.captured_queries, "the first scrape reads the database"
    TaskFactory(queue="emails")
    with CaptureQueriesContext(connection) as burst:
        answers = [client.get("/metrics").content for _ in range(199)]
    assert not burst.captured_queries and exposition.computed == computed + 1
    assert len(set(answers)) == 1, "the burst is answered with the first scrape's figures"
    exposition.forget()  # as VALKA_METRICS_CACHE_SECONDS passing would
    assert metrics(client)["valka_tasks[('queue', 'emails'), ('status', 'PENDING')]"] == 2


def test_concurrent_scrapes_wait_for_one_computation(live_server):
    computed = exposition.computed
    answers = []

    def scrape():
        with urllib.request.urlopen(f"{live_server.url}/metrics") as response:
            answers.append(response.read())

    threads = [threading.Thread(target=scrape) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 20 and len(set(answers)) == 1
    assert exposition.computed == computed + 1


def test_the_cache_lasts_the_configured_seconds(client, settings):
    settings.VALKA = {**settings.VALKA, "METRICS_CACHE_SECONDS": 0}
    computed = exposition.computed
    for _ in range(3):
        client.get("/metrics")
    assert exposition.computed == computed + 3


def test_a_scrape_writes_nothing(client):
    """Even with counter minutes old enough to fold, a scrape only reads (the scheduler folds)."""
    TaskFactory(queue="emails")
    written = "SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_xact_user_tables"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE task_counter_deltas SET minute = minute - interval '3 hours'")
        cursor.execute(written)
        before = cursor.fetchone()[0]
        assert metrics(client)["valka_tasks_created_total[('queue', 'emails')]"] == 1
        cursor.execute(written)
        assert cursor.fetchone()[0] == before, "the scrape wrote rows"
