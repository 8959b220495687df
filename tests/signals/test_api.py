import threading
import time
import uuid

import pytest
from django.db import connection
from django.utils import timezone

from signals import services
from signals.models import Signal
from tests.factories import SignalFactory, TaskFactory
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("status", ["PENDING", "DISPATCHING", "RETRY", "RUNNING"])
def test_signal_is_stored_pending_for_unfinished_tasks(client_api, status, settings):
    settings.VALKA = {**settings.VALKA, "SIGNAL_DELIVERY_WAIT": 0}
    task = TaskFactory(status=status)
    r = client_api.post(f"/api/v1/tasks/{task.id}/signal", {"signal_type": "progress_request",
                                                            "payload": {"a": [1]}}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["status"] == "PENDING" and body["delivered"] is False and body["task_id"] == str(task.id)
    assert Signal.objects.get(id=body["id"]).payload == {"a": [1]}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", ["DISPATCHING", "RUNNING"])
def test_a_signal_to_a_task_running_or_being_handed_over_waits_for_its_delivery(status):
    """A DISPATCHING task's worker has (or is about to have) its assignment; the dispatcher
    delivers the signal once the start is written. Another connection plays that part here."""
    task = TaskFactory(status=status)

    def dispatcher():
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if Signal.objects.filter(task_id=task.id).update(status="DELIVERED", delivered_at=timezone.now()):
                    return
                time.sleep(0.01)
        finally:
            connection.close()

    thread = threading.Thread(target=dispatcher)
    thread.start()
    signal, delivered = services.signal_send(task_id=task.id, signal_type="ping", wait=5.0)
    thread.join()
    assert delivered and signal.status == "DELIVERED" and signal.delivered_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_signal_taken_before_the_service_looks_again_counts_as_delivered():
    """A quick worker can take a signal, acknowledge it and finish its task between the signal's
    insert and the service's look at the task. A trigger plays that worker here, inside the insert."""
    task = TaskFactory(status="RUNNING")
    with connection.cursor() as cur:
        cur.execute("""
            CREATE FUNCTION test_quick_worker() RETURNS trigger AS $$ BEGIN
                UPDATE signals SET status = 'ACKNOWLEDGED', delivered_at = now(), acknowledged_at = now()
                WHERE id = NEW.id;
                UPDATE tasks SET status = 'COMPLETED', finished_at = now() WHERE id = NEW.task_id;
                RETURN NULL;
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER test_quick_worker AFTER INSERT ON signals FOR EACH ROW EXECUTE FUNCTION test_quick_worker();
        """)
    try:
        signal, delivered = services.signal_send(task_id=task.id, signal_type="ping", wait=5.0)
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER test_quick_worker ON signals; DROP FUNCTION test_quick_worker()")
    assert delivered and signal.status == "ACKNOWLEDGED" and signal.acknowledged_at is not None


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "DEAD_LETTER", "CANCELLED"])
def test_final_states_refuse_and_store_nothing(client_api, status):
    task = TaskFactory(status=status)
    assert_error(client_api.post(f"/api/v1/tasks/{task.id}/signal", {"signal_type": "x"}, format="json"),
                 409, "INVALID_STATE")
    assert Signal.objects.count() == 0


def test_bad_input_stores_nothing(client_api, settings):
    settings.VALKA = {**settings.VALKA, "MAX_SIGNAL_PAYLOAD_BYTES": 100}
    task = TaskFactory()
    url = f"/api/v1/tasks/{task.id}/signal"
    assert_error(client_api.post(url, {"payload": {}}, format="json"), 400, "VALIDATION_ERROR", "signal_type")
    assert_error(client_api.post(url, {"signal_type": 3}, format="json"), 400, "VALIDATION_ERROR", "signal_type")
    assert_error(client_api.post(url, data="{nope", content_type="application/json"), 400, "VALIDATION_ERROR")
    assert_error(client_api.post(url, {"signal_type": "x", "payload": "y" * 200}, format="json"), 413,
                 "PAYLOAD_TOO_LARGE", "payload")
    assert_error(client_api.post(f"/api/v1/tasks/{uuid.uuid4()}/signal", {"signal_type": "x"}, format="json"),
                 404, "NOT_FOUND")
    assert Signal.objects.count() == 0


def test_list_filter_and_get(client_api):
    s1 = SignalFactory(status="ACKNOWLEDGED")
    SignalFactory(task=s1.task, status="PENDING")
    base = f"/api/v1/tasks/{s1.task_id}/signals"
    assert client_api.get(base).json()["count"] == 2
    assert [x["id"] for x in client_api.get(base, {"status": "acknowledged"}).json()["results"]] == [str(s1.id)]
    assert_error(client_api.get(base, {"status": "NOPE"}), 400, "VALIDATION_ERROR", "status")
    assert client_api.get(f"/api/v1/signals/{s1.id}").json()["signal_name"] == s1.signal_type
    assert_error(client_api.get(f"/api/v1/signals/{uuid.uuid4()}"), 404, "NOT_FOUND")
