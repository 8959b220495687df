"""Workers page, the task page's signal form, and GET /metrics."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

import signals.services
from signals.models import Signal
from tasks.models import Task, TaskRun
from tests.factories import TaskFactory, TaskRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db


def test_workers_page_shows_in_flight_and_free_slots(admin_client):
    busy = WorkerFactory(name="busy-host", concurrency=3, queues=["emails", "reports"], node_id="node-7")
    TaskRunFactory.create_batch(2, worker_id=busy.id)
    gone = WorkerFactory(name="gone-host", status="DISCONNECTED", disconnected_at=timezone.now())
    html = admin_client.get("/admin/tasks/worker/").content.decode()
    row = html[html.index("busy-host"):html.index("</tr>", html.index("busy-host"))]
    assert "emails, reports" in row and "node-7" in row and "vk-connected" in row
    assert '<td class="field-in_flight">2</td>' in row and '<td class="field-free_slots">1</td>' in row
    assert "gone-host" in html and "vk-disconnected" in html
    assert admin_client.get(f"/admin/tasks/worker/{gone.id}/change/").status_code == 200


def test_signal_form_calls_the_signal_service(admin_client, monkeypatch):
    task = TaskFactory(status="RUNNING")
    sent = []

    def fake_send(*, task_id, signal_type, payload):
        sent.append((str(task_id), signal_type, payload))
        return Signal.objects.create(task_id=task_id, signal_type=signal_type, payload=payload), False

    monkeypatch.setattr(signals.services, "signal_send", fake_send)
    html = admin_client.get(f"/admin/tasks/task/{task.id}/change/").content.decode()
    assert 'id="vk-signal-form"' in html
    r = admin_client.post(f"/admin/tasks/task/{task.id}/signal/", {"signal_type": "pause", "payload": '{"s": 5}'},
                          follow=True)
    assert sent == [(str(task.id), "pause", {"s": 5})]
    assert "Signal &#x27;pause&#x27; sent (PENDING)." in r.content.decode()


def test_signal_form_stores_a_signal_through_the_real_service(admin_client):
    task = TaskFactory(status="PENDING")
    r = admin_client.post(f"/admin/tasks/task/{task.id}/signal/", {"signal_type": "resume", "payload": "[1, 2]"},
                          follow=True)
    (signal,) = Signal.objects.filter(task_id=task.id)
    assert (signal.signal_type, signal.payload, signal.status) == ("resume", [1, 2], "PENDING")
    assert "resume" in r.content.decode() and "vk-pending" in r.content.decode()
    done = TaskFactory(status="COMPLETED")
    r = admin_client.post(f"/admin/tasks/task/{done.id}/signal/", {"signal_type": "resume"}, follow=True)
    assert "Signal not sent" in r.content.decode() and not Signal.objects.filter(task_id=done.id).exists()


def test_signal_needs_permission(staff_client):
    task = TaskFactory(status="RUNNING")
    viewer = staff_client("tasks.view_task")
    assert 'id="vk-signal-form"' not in viewer.get(f"/admin/tasks/task/{task.id}/change/").content.decode()
    assert viewer.post(f"/admin/tasks/task/{task.id}/signal/", {"signal_type": "pause"}).status_code == 403
    assert not Signal.objects.exists()


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
