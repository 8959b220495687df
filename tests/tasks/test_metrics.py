"""GET /metrics: computed from the database, public unless configured otherwise, and label values
(queue names, which rows from elsewhere could make hostile) quoted."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tasks.models import Task, TaskRun
from tests.factories import TaskFactory, TaskRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db


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


def test_metrics_can_require_authentication(client, admin_client, api_key):
    with override_settings(VALKA={**settings.VALKA, "METRICS_PUBLIC": False}):
        r = client.get("/metrics")
        assert r.status_code == 401 and r["WWW-Authenticate"] == "Bearer"
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer vk_wrong").status_code == 401
        metrics(client, HTTP_AUTHORIZATION=f"Bearer {api_key}")
        metrics(admin_client)


def test_metrics_quote_hostile_queue_names(client):
    # Written around the API's queue validator, as rows from elsewhere could be.
    for queue in ['a"b', "line\nbreak", "back\\slash", "x'; DROP TABLE tasks; --"]:
        TaskFactory(queue=queue)
    r = client.get("/metrics")
    assert r.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(r.content.decode())}
    queues = {s.labels["queue"] for s in families["valka_tasks"].samples}
    assert {'a"b', "line\nbreak", "back\\slash", "x'; DROP TABLE tasks; --"} <= queues
