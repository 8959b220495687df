"""POST/GET/DELETE /api/v1/tasks and its validation."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from tasks.models import Task
from tests.factories import TaskFactory, TaskLogFactory, TaskRunFactory
from tests.helpers import assert_error
from valka_sdk.ids import uuid7

pytestmark = pytest.mark.django_db

URL = "/api/v1/tasks"


def create(client, **body):
    return client.post(URL, body, format="json")


def test_create_defaults(client_api):
    r = create(client_api, task_name="send_email", queue="emails", input={"to": "a@example.com"})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["status"] == "PENDING" and body["task_id"] == body["id"]
    assert body["input"] == {"to": "a@example.com"} and body["metadata"] == {}
    assert body["priority"] == 0 and body["max_retries"] == 3 and body["timeout_seconds"] == 300
    assert body["attempt_count"] == 0 and body["output"] is None
    task = Task.objects.get(id=body["id"])
    assert task.queue == "emails" and task.run_at <= datetime.now(UTC)


def test_omitted_input_is_null(client_api):
    body = create(client_api, task_name="t", queue="q").json()
    assert body["input"] is None and body["metadata"] == {}


def test_aliases_queue_name_and_scheduled_at(client_api):
    when = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    r = create(client_api, task_name="t", queue_name="reports", scheduled_at=when.isoformat().replace("+00:00", "Z"))
    assert r.status_code == 201, r.content
    task = Task.objects.get(id=r.json()["id"])
    assert task.queue == "reports" and task.run_at == when


def test_all_fields(client_api):
    r = create(client_api, task_name="t", queue="q", input=[1, "two"], priority=7, max_retries=0,
               timeout_seconds=5, metadata={"tenant": 9}, run_at="2030-01-01T00:00:00+02:00")
    assert r.status_code == 201
    task = Task.objects.get(id=r.json()["id"])
    assert (task.priority, task.max_retries, task.timeout_seconds) == (7, 0, 5)
    assert task.input == [1, "two"] and task.metadata == {"tenant": 9}
    assert task.run_at == datetime(2029, 12, 31, 22, tzinfo=UTC)


@pytest.mark.parametrize(("body", "field"), [
    ({"queue": "q"}, "task_name"),
    ({"task_name": "t"}, "queue"),
    ({"task_name": "t", "queue": "bad queue!"}, "queue"),
    ({"task_name": "t", "queue": "q" * 256}, "queue"),
    ({"task_name": "t" * 256, "queue": "q"}, "task_name"),
    ({"task_name": "t", "queue": "q", "run_at": "2030-01-01T00:00:00"}, "run_at"),
    ({"task_name": "t", "queue": "q", "run_at": "tomorrow"}, "run_at"),
    ({"task_name": "t", "queue": "q", "run_at": "2030-01-01"}, "run_at"),
    ({"task_name": "t", "queue": "q", "max_retries": -1}, "max_retries"),
    ({"task_name": "t", "queue": "q", "max_retries": "3"}, "max_retries"),
    ({"task_name": "t", "queue": "q", "timeout_seconds": 0}, "timeout_seconds"),
    ({"task_name": "t", "queue": "q", "timeout_seconds": 86401}, "timeout_seconds"),
    ({"task_name": "t", "queue": "q", "metadata": [1, 2]}, "metadata"),
    ({"task_name": "t", "queue": "q", "metadata": "x"}, "metadata"),
    ({"task_name": "t", "queue": "q", "priority": 2**31}, "priority"),
    ({"task_name": "t", "queue": "q", "priority": True}, "priority"),
    ({"task_name": "t\x00", "queue": "q"}, "task_name"),
    ({"task_name": "t", "queue": "q", "input": {"a": "\x00"}}, "input"),
    ({"task_name": 5, "queue": "q"}, "task_name"),
])
def test_validation_names_the_field_and_writes_nothing(client_api, body, field):
    assert_error(create(client_api, **body), 400, "VALIDATION_ERROR", field)
    assert Task.objects.count() == 0


def test_malformed_json(client_api):
    r = client_api.post(URL, data='{"task_name": ', content_type="application/json")
    assert_error(r, 400, "VALIDATION_ERROR")
    r = client_api.post(URL, data='[1, 2]', content_type="application/json")
    assert_error(r, 400, "VALIDATION_ERROR")
    assert Task.objects.count() == 0


def test_oversized_fields_get_413(client_api, settings):
    settings.VALKA = {**settings.VALKA, "MAX_PAYLOAD_BYTES": 1000}
    assert_error(create(client_api, task_name="t", queue="q", input="x" * 1001), 413, "PAYLOAD_TOO_LARGE", "input")
    assert_error(create(client_api, task_name="t", queue="q", metadata={"k": "x" * 1001}), 413,
                 "PAYLOAD_TOO_LARGE", "metadata")
    assert Task.objects.count() == 0


def test_one_mebibyte_input_is_accepted_and_over_it_is_413(client_api):
    ok = "x" * (1024 * 1024 - 2)  # JSON adds the quotes
    assert create(client_api, task_name="t", queue="q", input=ok).status_code == 201
    assert_error(create(client_api, task_name="t", queue="q", input=ok + "x"), 413, "PAYLOAD_TOO_LARGE", "input")


def test_idempotency_key_returns_the_existing_task(client_api):
    first = create(client_api, task_name="t", queue="q", idempotency_key="order-1")
    again = create(client_api, task_name="other", queue="q2", idempotency_key="order-1")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["task_name"] == "t"
    assert Task.objects.count() == 1


def test_a_client_made_id_names_the_task_and_a_repeat_answers_it(client_api):
    task_id = str(uuid7())
    first = create(client_api, id=task_id, task_name="t", queue="q", input={"n": 1})
    assert (first.status_code, first.json()["id"]) == (201, task_id)
    again = create(client_api, id=task_id, task_name="t", queue="q", input={"n": 1})
    assert (again.status_code, again.json()["id"], again.json()["input"]) == (200, task_id, {"n": 1})
    other = create(client_api, id=str(uuid7()), task_name="t", queue="q", idempotency_key="k")
    keyed = create(client_api, id=str(uuid7()), task_name="t", queue="q", idempotency_key="k")
    assert keyed.status_code == 200 and keyed.json()["id"] == other.json()["id"], "an existing key wins"
    assert Task.objects.count() == 2
    for bad in ("not-a-uuid", 12, "x" * 100):
        assert_error(create(client_api, id=bad, task_name="t", queue="q"), 400, "VALIDATION_ERROR", "id")
    assert Task.objects.count() == 2


def test_get_list_filters_and_pagination(client_api):
    for i in range(5):
        TaskFactory(queue="a", task_name="x" if i % 2 else "y")
    TaskFactory(queue="b", status="COMPLETED")
    r = client_api.get(URL, {"limit": 2})
    body = r.json()
    assert body["count"] == 6 and len(body["results"]) == 2 and body["next"] and body["previous"] is None
    ids = [t["id"] for t in client_api.get(URL, {"limit": 100}).json()["results"]]
    assert ids == sorted(ids, reverse=True), "newest first"
    assert client_api.get(URL, {"queue": "b"}).json()["count"] == 1
    assert client_api.get(URL, {"queue_name": "a"}).json()["count"] == 5
    assert client_api.get(URL, {"status": "COMPLETED"}).json()["count"] == 1
    assert client_api.get(URL, {"task_name": "x", "queue": "a"}).json()["count"] == 2
    assert_error(client_api.get(URL, {"status": "NOPE"}), 400, "VALIDATION_ERROR", "status")
    assert client_api.get(URL, {"limit": 5000}).status_code == 200


def test_created_filters(client_api):
    old = TaskFactory()
    Task.objects.filter(id=old.id).update(created_at=datetime(2020, 1, 1, tzinfo=UTC))
    TaskFactory()
    assert client_api.get(URL, {"created_before": "2021-01-01T00:00:00Z"}).json()["count"] == 1
    assert client_api.get(URL, {"created_after": "2021-01-01T00:00:00Z"}).json()["count"] == 1
    assert_error(client_api.get(URL, {"created_after": "yesterday"}), 400, "VALIDATION_ERROR", "created_after")


def test_limit_is_clamped_to_1000(client_api):
    Task.objects.bulk_create([Task(task_name="t", queue="q") for _ in range(1005)])
    body = client_api.get(URL, {"limit": 5000}).json()
    assert len(body["results"]) == 1000 and body["count"] == 1005


def test_retrieve_and_404s(client_api):
    task = TaskFactory(status="COMPLETED", output={"ok": True})
    body = client_api.get(f"{URL}/{task.id}").json()
    assert body["output"] == {"ok": True} and body["status"] == "COMPLETED" and body["finished_at"]
    assert_error(client_api.get(f"{URL}/{uuid.uuid4()}"), 404, "NOT_FOUND")
    assert_error(client_api.get(f"{URL}/not-a-uuid"), 404, "NOT_FOUND")
    assert_error(client_api.get(f"{URL}/{uuid.uuid4()}/runs"), 404, "NOT_FOUND")


@pytest.mark.parametrize("status", ["PENDING", "DISPATCHING", "RUNNING"])
def test_cancel_active(client_api, status):
    task = TaskFactory(status=status)
    run = TaskRunFactory(task=task) if status == "RUNNING" else None
    r = client_api.post(f"{URL}/{task.id}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED"
    if run:
        run.refresh_from_db()
        assert run.status == "CANCELLED" and run.finished_at


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "RETRY", "DEAD_LETTER", "CANCELLED"])
def test_cancel_refused(client_api, status):
    task = TaskFactory(status=status)
    assert_error(client_api.post(f"{URL}/{task.id}/cancel"), 409, "INVALID_STATE")
    task.refresh_from_db()
    assert task.status == status


def test_cancel_unknown(client_api):
    assert_error(client_api.post(f"{URL}/{uuid.uuid4()}/cancel"), 404, "NOT_FOUND")


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "DEAD_LETTER", "CANCELLED"])
def test_delete_final(client_api, status):
    task = TaskFactory(status=status)
    log = TaskLogFactory(run=TaskRunFactory(task=task, status="COMPLETED"))
    assert client_api.delete(f"{URL}/{task.id}").status_code == 204
    assert not Task.objects.filter(id=task.id).exists()
    assert not type(log).objects.filter(id=log.id).exists()


@pytest.mark.parametrize("status", ["PENDING", "DISPATCHING", "RUNNING", "RETRY"])
def test_delete_active_refused(client_api, status):
    task = TaskFactory(status=status)
    assert_error(client_api.delete(f"{URL}/{task.id}"), 409, "INVALID_STATE")
    assert Task.objects.filter(id=task.id).exists()
    assert_error(client_api.delete(f"{URL}/{uuid.uuid4()}"), 404, "NOT_FOUND")


def test_runs_and_logs(client_api):
    run = TaskRunFactory()
    logs = [TaskLogFactory(run=run, level=level) for level in ("DEBUG", "INFO", "WARN", "ERROR")]
    runs = client_api.get(f"{URL}/{run.task_id}/runs").json()
    assert runs["count"] == 1
    assert runs["results"][0]["worker_id"] == "worker-1" and runs["results"][0]["status"] == "RUNNING"
    base = f"{URL}/{run.task_id}/runs/{run.id}/logs"
    body = client_api.get(base).json()
    assert [line["level"] for line in body["results"]] == ["DEBUG", "INFO", "WARN", "ERROR"]
    assert set(body["results"][0]) >= {"id", "timestamp", "level", "message", "metadata"}
    after = client_api.get(base, {"after": logs[1].id}).json()["results"]
    assert [line["id"] for line in after] == [logs[2].id, logs[3].id]
    assert [x["id"] for x in client_api.get(base, {"after_id": logs[2].id}).json()["results"]] == [logs[3].id]
    assert_error(client_api.get(base, {"after": "x"}), 400, "VALIDATION_ERROR", "after")
    assert_error(client_api.get(f"{URL}/{run.task_id}/runs/{uuid.uuid4()}/logs"), 404, "NOT_FOUND")
