"""GET /api/v1/dead-letters (list, detail, filter) and POST /api/v1/dead-letters/<id>/replay."""

import uuid

import pytest

from tests.factories import DeadLetterFactory
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db


def test_dead_letter_list_detail_and_filter(client_api):
    a = DeadLetterFactory(queue="a")
    DeadLetterFactory(queue="b")
    body = client_api.get("/api/v1/dead-letters").json()
    assert body["count"] == 2
    assert client_api.get("/api/v1/dead-letters", {"queue": "a"}).json()["results"][0]["id"] == str(a.id)
    detail = client_api.get(f"/api/v1/dead-letters/{a.id}").json()
    assert detail["error_message"] == "boom" and detail["attempt_count"] == 4
    assert detail["task_id"] == str(a.task_id)
    assert_error(client_api.get(f"/api/v1/dead-letters/{uuid.uuid4()}"), 404, "NOT_FOUND")


def test_replay_creates_a_linked_pending_task(client_api):
    letter = DeadLetterFactory(metadata={"tenant": 3}, input={"x": 1})
    r = client_api.post(f"/api/v1/dead-letters/{letter.id}/replay")
    assert r.status_code == 201, r.content
    new = r.json()
    assert new["status"] == "PENDING" and new["id"] != str(letter.task_id)
    assert (new["task_name"], new["queue"], new["input"], new["metadata"]) == (
        letter.task_name, letter.queue, {"x": 1}, {"tenant": 3})
    assert new["replayed_from_dead_letter_id"] == str(letter.id)
    assert new["replayed_from_task_id"] == str(letter.task_id)
    shown = client_api.get(f"/api/v1/dead-letters/{letter.id}").json()
    assert shown["replay_task_id"] == new["id"] and shown["replayed_at"] and shown["replay_count"] == 1
    assert_error(client_api.post(f"/api/v1/dead-letters/{uuid.uuid4()}/replay"), 404, "NOT_FOUND")
