"""The task page's signal form: it calls the signal service, stores a signal, and needs permission."""

import pytest

import signals.services
from signals.models import Signal
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


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
