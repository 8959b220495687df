"""A task's concurrency key, through every way in: REST (single and batch), the in-process API,
gRPC CreateTask (the reserved metadata key), and replays of the task or of its dead letter."""

import json

import pytest

import valka
from dispatcher import api_service, protocol
from tasks import services
from tasks.errors import ValidationError
from tasks.models import DeadLetter, Task
from tests.factories import TaskFactory
from tests.helpers import assert_error
from valka_sdk.v1 import api_pb2

pytestmark = pytest.mark.django_db

URL = "/api/v1/tasks"


def test_rest_takes_the_key_and_answers_with_it(client_api):
    response = client_api.post(URL, {"task_name": "t", "queue": "q", "concurrency_key": "customer-42"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["concurrency_key"] == "customer-42"
    task = Task.objects.get(id=response.json()["id"])
    assert task.concurrency_key == "customer-42"
    assert client_api.get(f"{URL}/{task.id}").json()["concurrency_key"] == "customer-42"
    plain = client_api.post(URL, {"task_name": "t", "queue": "q"}, format="json").json()
    assert plain["concurrency_key"] is None


@pytest.mark.parametrize("key, problem", [
    ("k" * 201, "at most 200 characters"),
    ("a\x00b", "NUL"),
    (42, "must be a string"),
])
def test_a_bad_key_is_refused_naming_the_field_and_nothing_is_written(client_api, key, problem):
    response = client_api.post(URL, {"task_name": "t", "queue": "q", "concurrency_key": key}, format="json")
    assert_error(response, 400, "VALIDATION_ERROR", "concurrency_key")
    assert problem in response.json()["message"]
    assert Task.objects.count() == 0


def test_a_key_of_200_characters_is_kept():
    assert valka.enqueue("t", queue="q", concurrency_key="k" * 200).concurrency_key == "k" * 200


def test_a_batch_takes_each_task_s_key_and_refuses_a_bad_one_alone(client_api):
    body = {"tasks": [{"task_name": "t", "queue": "q", "concurrency_key": "a"},
                      {"task_name": "t", "queue": "q", "concurrency_key": "x" * 201},
                      {"task_name": "t", "queue": "q"}]}
    results = client_api.post(f"{URL}/batch", body, format="json").json()["results"]
    assert [r["status"] for r in results] == [201, 400, 201]
    assert "concurrency_key" in results[1]["error"]["details"]
    assert [r["task"]["concurrency_key"] for r in (results[0], results[2])] == ["a", None]
    assert list(Task.objects.order_by("id").values_list("concurrency_key", flat=True)) == ["a", None]


def test_the_in_process_api_takes_the_key():
    one = valka.enqueue("t", queue="q", concurrency_key="one")
    many = valka.enqueue_many([{"task_name": "t", "concurrency_key": "a"}, {"task_name": "t"}])
    assert (one.concurrency_key, [t.concurrency_key for t in many]) == ("one", ["a", None])
    assert list(Task.objects.order_by("id").values_list("concurrency_key", flat=True)) == ["one", "a", None]
    with pytest.raises(ValidationError, match=r"tasks\[0\]\.concurrency_key"):
        services.task_enqueue_many([{"task_name": "t", "queue": "q", "concurrency_key": "\x00"}])


def test_grpc_carries_the_key_in_the_metadata_under_the_reserved_key():
    request = api_pb2.CreateTaskRequest(queue_name="q", task_name="t",
                                        metadata=json.dumps({"valka.concurrency_key": "c-1", "m": 1}))
    task = api_service.create_task(request)
    row = Task.objects.get(id=task.id)
    assert (row.concurrency_key, row.metadata) == ("c-1", {"m": 1}), "the key is a column, not metadata"
    assert json.loads(protocol.task_meta(row).metadata) == {"valka.concurrency_key": "c-1", "m": 1}
    plain = api_service.create_task(api_pb2.CreateTaskRequest(queue_name="q", task_name="t", metadata='{"m": 2}'))
    assert json.loads(protocol.task_meta(plain).metadata) == {"m": 2}
    with pytest.raises(ValidationError, match="concurrency_key"):
        api_service.create_task(api_pb2.CreateTaskRequest(
            queue_name="q", task_name="t", metadata=json.dumps({"valka.concurrency_key": "x" * 201})))


def test_replays_keep_the_key():
    failed = TaskFactory(status="FAILED", concurrency_key="k")
    assert services.task_replay(task_id=failed.id).concurrency_key == "k"
    dead = TaskFactory(status="RETRY", attempt_count=4, max_retries=3, concurrency_key="d")
    services.dead_letter_tasks(task_ids=[dead.id])
    letter = DeadLetter.objects.get(task_id=dead.id)
    assert letter.concurrency_key == "d"
    assert services.dead_letter_replay(dead_letter_id=letter.id).concurrency_key == "d"
