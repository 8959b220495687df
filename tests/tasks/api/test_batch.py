"""POST /api/v1/tasks/batch, `services.task_create_many` and the in-process `valka.enqueue_many`."""

import asyncio
import threading

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

import valka
from tasks import services
from tasks.errors import ValidationError
from tasks.models import Task
from tasks.specs import parse_task_spec
from tests.helpers import database_url
from valka_sdk.ids import uuid7

URL = "/api/v1/tasks/batch"


def post(client, tasks):
    return client.post(URL, {"tasks": tasks}, format="json")


def statements(queries, prefix):
    return [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith(prefix)]


@pytest.mark.django_db
def test_creates_every_task_in_order(client_api):
    items = [{"task_name": f"t{i}", "queue": "q" if i % 2 else "r", "input": {"i": i}} for i in range(5)]
    r = post(client_api, items)
    assert r.status_code == 201, r.content
    results = r.json()["results"]
    assert [x["status"] for x in results] == [201] * 5
    assert [x["task"]["input"] for x in results] == [{"i": i} for i in range(5)]
    assert [x["task"]["task_name"] for x in results] == [f"t{i}" for i in range(5)]
    body = results[0]["task"]
    assert body["status"] == "PENDING" and body["max_retries"] == 3 and body["timeout_seconds"] == 300
    assert Task.objects.count() == 5


@pytest.mark.django_db
def test_each_item_is_validated_on_its_own(client_api, settings):
    settings.VALKA = {**settings.VALKA, "MAX_PAYLOAD_BYTES": 100}
    items = [
        {"task_name": "ok", "queue": "q"},
        {"task_name": "t", "queue": "bad queue!"},
        {"task_name": "big", "queue": "q", "input": "x" * 200},
        "not an object",
        {"queue": "q"},
        {"task_name": "also-ok", "queue_name": "q", "scheduled_at": "2030-01-01T00:00:00Z"},
    ]
    r = post(client_api, items)
    assert r.status_code == 201, r.content
    results = r.json()["results"]
    assert [x["status"] for x in results] == [201, 400, 413, 400, 400, 201]
    for x in (results[1], results[2], results[3], results[4]):
        assert set(x) == {"status", "error"}
        assert set(x["error"]) == {"error", "message", "details"}
    assert results[1]["error"]["error"] == "VALIDATION_ERROR" and "queue" in results[1]["error"]["details"]
    assert results[2]["error"]["error"] == "PAYLOAD_TOO_LARGE"
    assert "task_name" in results[4]["error"]["details"]
    assert sorted(Task.objects.values_list("task_name", flat=True)) == ["also-ok", "ok"]
    assert results[5]["task"]["run_at"].startswith("2030-01-01")


@pytest.mark.django_db
def test_nothing_valid_answers_200_and_writes_nothing(client_api):
    r = post(client_api, [{"task_name": "t"}, {"queue": "q"}])
    assert r.status_code == 200
    assert [x["status"] for x in r.json()["results"]] == [400, 400]
    assert not Task.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("body", [{"tasks": "x"}, {"tasks": {"task_name": "t"}}, {}, [{"task_name": "t"}],
                                  {"tasks": None}])
def test_a_body_without_a_list_of_tasks_is_rejected(client_api, body):
    r = client_api.post(URL, body, format="json")
    assert r.status_code == 400, r.content
    assert r.json()["error"] == "VALIDATION_ERROR" and "tasks" in r.json()["details"]


@pytest.mark.django_db
def test_at_most_1000_tasks_per_request(client_api):
    r = post(client_api, [{"task_name": "t", "queue": "q"}] * 1001)
    assert r.status_code == 400
    assert "1000" in r.json()["message"]
    assert not Task.objects.exists()
    r = post(client_api, [{"task_name": "t", "queue": "q"}] * 1000)
    assert r.status_code == 201
    assert Task.objects.count() == 1000


@pytest.mark.django_db
def test_an_empty_list_creates_nothing(client_api):
    r = post(client_api, [])
    assert (r.status_code, r.json()) == (200, {"results": []})


@pytest.mark.django_db
def test_idempotency_within_a_batch(client_api):
    items = [
        {"task_name": "charge", "queue": "billing", "idempotency_key": "k1", "input": 1},
        {"task_name": "charge", "queue": "billing", "idempotency_key": "k2"},
        {"task_name": "charge", "queue": "billing", "idempotency_key": "k1", "input": 2},
        {"task_name": "charge", "queue": "billing"},
    ]
    results = post(client_api, items).json()["results"]
    assert [x["status"] for x in results] == [201, 201, 200, 201]
    assert results[0]["task"]["id"] == results[2]["task"]["id"]
    assert results[2]["task"]["input"] == 1, "the first item with a key wins"
    assert Task.objects.filter(idempotency_key="k1").count() == 1
    assert Task.objects.count() == 3


@pytest.mark.django_db
def test_client_made_ids_in_a_batch(client_api):
    taken = services.task_enqueue(task_name="t", queue="q", id=uuid7())
    ids = [str(uuid7()) for _ in range(3)]
    items = [{"id": ids[0], "task_name": "t", "queue": "q", "input": 1},
             {"id": ids[1], "task_name": "t", "queue": "q"},
             {"id": ids[0], "task_name": "t", "queue": "q", "input": 2},
             {"id": str(taken.id), "task_name": "t", "queue": "q"},
             {"id": ids[2], "task_name": "t", "queue": "q", "idempotency_key": "k"},
             {"id": "nope", "task_name": "t", "queue": "q"},
             {"task_name": "t", "queue": "q"}]
    results = post(client_api, items).json()["results"]
    assert [x["status"] for x in results] == [201, 201, 200, 200, 201, 400, 201]
    assert [x["task"]["id"] for x in results[:5]] == [ids[0], ids[1], ids[0], str(taken.id), ids[2]]
    assert results[2]["task"]["input"] == 1, "the first item with an id wins"
    assert "id" in results[5]["error"]["details"]
    again = post(client_api, items[:2]).json()["results"]
    assert [(x["status"], x["task"]["id"]) for x in again] == [(200, ids[0]), (200, ids[1])]
    assert Task.objects.count() == 5


@pytest.mark.django_db
def test_idempotency_between_batches_and_single_creates(client_api):
    single = client_api.post("/api/v1/tasks", {"task_name": "t", "queue": "q", "idempotency_key": "a"},
                             format="json").json()
    first = post(client_api, [{"task_name": "t", "queue": "q", "idempotency_key": k} for k in ("a", "b")])
    assert [x["status"] for x in first.json()["results"]] == [200, 201]
    assert first.json()["results"][0]["task"]["id"] == single["id"]
    again = post(client_api, [{"task_name": "t", "queue": "q", "idempotency_key": k} for k in ("b", "a")])
    assert again.status_code == 200, "nothing new"
    assert [x["status"] for x in again.json()["results"]] == [200, 200]
    ids = {x["task"]["idempotency_key"]: x["task"]["id"] for x in first.json()["results"]}
    assert [x["task"]["id"] for x in again.json()["results"]] == [ids["b"], ids["a"]]
    assert Task.objects.count() == 2


@pytest.mark.django_db
def test_one_insert_statement_per_batch():
    services.task_enqueue(task_name="t", queue="q", idempotency_key="taken")
    specs = [parse_task_spec({"task_name": "t", "queue": f"q{i % 3}", "input": {"i": i},
                              "idempotency_key": f"k{i}" if i % 10 == 0 else None}) for i in range(300)]
    specs.append(parse_task_spec({"task_name": "t", "queue": "q", "idempotency_key": "taken"}))
    with CaptureQueriesContext(connection) as queries:
        results = services.task_create_many(specs=specs)
    assert len(statements(queries, "WITH INS AS (\n    INSERT")) == 1
    assert len(queries) == 2, [q["sql"][:80] for q in queries]  # the insert, and one select for "taken"
    assert [created for _, created in results] == [True] * 300 + [False]
    assert Task.objects.count() == 301
    # Without a conflict there is nothing to look up: one statement in all.
    with CaptureQueriesContext(connection) as queries:
        services.task_create_many(specs=[parse_task_spec({"task_name": "t", "queue": "q"})] * 50)
    assert len(queries) == 1


@pytest.mark.django_db
def test_every_field_reaches_its_row_as_sent():
    """The batch's JSON is put together from pieces: text that JSON must escape, inputs and
    metadata of every JSON type, and due times with offsets arrive in the rows unchanged."""
    awkward = 'quote " backslash \\ tab \t newline \n é 漢 \u2028 😀'
    items = [
        {"task_name": awkward, "queue": "q.1:a-b_c", "input": {"s": awkward, "n": [1, -2.5, 1e-7, True, None]},
         "metadata": {"k": awkward}, "idempotency_key": awkward, "priority": -(2**31), "max_retries": 0,
         "timeout_seconds": 86400, "run_at": "2030-01-01T02:00:00.123456+02:00"},
        {"task_name": "t", "queue": "q", "input": None},
        {"task_name": "t", "queue": "q", "input": "text"},
        {"task_name": "t", "queue": "q", "input": [[], {}, 0]},
        {"task_name": "t", "queue": "q", "input": 2**70, "priority": 2**31 - 1},
    ]
    specs = [parse_task_spec(item) for item in items]
    results = services.task_create_many(specs=specs)
    assert [created for _, created in results] == [True] * len(items)
    for (task, _), item, spec in zip(results, items, specs, strict=True):
        row = Task.objects.get(id=task.id)
        for name in ("task_name", "queue", "input", "idempotency_key", "priority", "max_retries", "timeout_seconds"):
            assert getattr(row, name) == getattr(spec, name), name
        assert row.metadata == spec.metadata == item.get("metadata", {})
        assert row.input == item["input"]
        assert row.run_at == (spec.run_at or row.created_at) == task.run_at
    assert Task.objects.get(id=results[0][0].id).run_at.isoformat() == "2030-01-01T00:00:00.123456+00:00"


@pytest.mark.django_db
def test_enqueue_many_in_process_validates_everything_first():
    with pytest.raises(ValidationError) as err:
        valka.enqueue_many([{"task_name": "ok"}, {"task_name": "t", "queue": "bad queue!"}])
    assert err.value.message.startswith("tasks[1].queue")
    assert "tasks[1]" in err.value.details
    assert not Task.objects.exists()
    tasks = valka.enqueue_many([{"task_name": "a"}, {"task_name": "b", "queue": "other", "priority": 5}])
    assert [(t.task_name, t.queue, t.priority) for t in tasks] == [("a", "default", 0), ("b", "other", 5)]
    one = valka.enqueue("c", input={"x": 1})
    assert (one.queue, one.input, one.status) == ("default", {"x": 1}, "PENDING")


def _listen(channel):
    conn = psycopg.connect(database_url(), autocommit=True)
    conn.execute(f"LISTEN {channel}")
    return conn


@pytest.mark.django_db(transaction=True)
def test_one_notify_per_ready_queue_and_only_on_commit():
    listener = _listen("valka_task_ready")
    try:
        items = [{"task_name": "t", "queue": q} for q in ("a", "b", "a", "a", "b")]
        items.append({"task_name": "t", "queue": "later", "run_at": "2100-01-01T00:00:00Z"})
        with pytest.raises(RuntimeError), transaction.atomic():
            valka.enqueue_many(items)
            raise RuntimeError("the caller's transaction fails")
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
        assert not Task.objects.exists()
        with transaction.atomic():
            valka.enqueue_many(items)
            assert list(listener.notifies(timeout=0.3, stop_after=1)) == [], "nothing before commit"
        got = sorted(n.payload for n in listener.notifies(timeout=10.0, stop_after=2))
        assert got == ["a", "b"]
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
        assert Task.objects.count() == 6
    finally:
        listener.close()


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_sharing_keys_in_any_order(api_key):
    """Batches that share keys in opposite orders neither deadlock nor duplicate a key."""
    keys = [f"order-{i}" for i in range(40)]
    results, errors = [], []
    barrier = threading.Barrier(6)

    def send(n):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key}")
        ordered = keys if n % 2 else list(reversed(keys))
        barrier.wait()
        try:
            r = post(client, [{"task_name": "charge", "queue": "billing", "idempotency_key": k} for k in ordered])
            results.append((r.status_code, {x["task"]["idempotency_key"]: (x["status"], x["task"]["id"])
                                            for x in r.json()["results"]}))
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(results) == 6 and all(code in (200, 201) for code, _ in results)
    assert Task.objects.count() == len(keys)
    for key in keys:
        seen = [by_key[key] for _, by_key in results]
        assert len({task_id for _, task_id in seen}) == 1
        assert sorted(status for status, _ in seen) == [200] * 5 + [201]


@pytest.mark.django_db
def test_the_schema_documents_the_batch_endpoint(anon_client):
    schema = anon_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/v1/tasks/batch/"]["post"]
    assert {"200", "201", "400"} <= set(operation["responses"])
    assert "TaskBatchCreate" in str(operation["requestBody"])


@pytest.mark.django_db(transaction=True)
def test_sdk_clients_create_tasks_against_the_web_app(tmp_path):
    from tests.helpers import Stack
    from valka_sdk import AsyncClient, Client

    stack = Stack(tmp_path)
    try:
        url = stack.web()
        with Client(url) as client:
            results = client.create_tasks([{"task_name": "t", "queue": "q", "idempotency_key": "one"},
                                           {"task_name": "t", "queue": "bad queue!"}])
        assert [r["status"] for r in results] == [201, 400]
        assert results[1]["error"]["error"] == "VALIDATION_ERROR"

        async def again():
            async with AsyncClient(url) as client:
                return await client.create_tasks([{"task_name": "t", "queue": "q", "idempotency_key": "one"}])

        repeated = asyncio.run(again())
        assert [r["status"] for r in repeated] == [200]
        assert repeated[0]["task"]["id"] == results[0]["task"]["id"]
    finally:
        stack.stop_all()


@pytest.mark.django_db
def test_task_data_matches_the_task_serializer():
    from datetime import UTC, datetime

    from tasks.api.serializers import TaskData, TaskSerializer, task_data
    from tests.factories import TaskFactory

    created = services.task_enqueue(task_name="t", queue="q", input={"b": 1, "a": [1.5, None]},
                                    metadata={"m": "x"}, idempotency_key="k", run_at="2030-01-01T02:00:00+02:00",
                                    concurrency_key="customer-1")
    finished = TaskFactory(status="COMPLETED", output={"ok": True}, error_message="e", attempt_count=1,
                           started_at=datetime(2026, 1, 1, tzinfo=UTC), finished_at=datetime.now(UTC))
    replay = services.task_replay(task_id=TaskFactory(status="FAILED", finished_at=datetime.now(UTC)).id)
    shared = TaskData()  # as a batch uses it: one formatter for every task's times
    for task in (created, Task.objects.get(id=created.id), finished, replay, Task.objects.get(id=replay.id)):
        assert task_data(task) == TaskSerializer(task).data
        assert shared(task) == TaskSerializer(task).data


@pytest.mark.django_db
def test_a_task_alone_and_in_a_batch_make_the_same_row():
    """A task alone takes a statement of its own (faster than a batch of one: docs/performance.md).
    Both statements write the same row, and the Task each hands back is the row as read."""
    item = {"task_name": "same", "queue": "q", "input": {"a": [1, "é", None]}, "metadata": {"m": 1},
            "priority": 7, "max_retries": 2, "timeout_seconds": 30, "run_at": "2030-01-01T00:00:00+02:00",
            "concurrency_key": "customer-7"}
    alone, created = services.task_create(spec=parse_task_spec({**item, "idempotency_key": "alone"}))
    specs = [parse_task_spec({**item, "idempotency_key": "batched"}), parse_task_spec({"task_name": "x", "queue": "q"})]
    (batched, created_too), _ = services.task_create_many(specs=specs)
    assert created and created_too
    names = [f.attname for f in Task._meta.concrete_fields]
    rows = {task.id: Task.objects.get(id=task.id) for task in (alone, batched)}
    for task in (alone, batched):
        assert [getattr(task, n) for n in names] == [getattr(rows[task.id], n) for n in names]
    same = [n for n in names if n not in ("id", "idempotency_key", "created_at", "updated_at")]
    assert [getattr(rows[alone.id], n) for n in same] == [getattr(rows[batched.id], n) for n in same]
