"""The REST create's direct path (tasks.api.direct): a key's plain create is answered without
Django's request cycle, with the answer the whole stack gives; everything else is handed to
the stack. Driven through the ASGI entry, each request beside the same request with the direct
path off."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.core import signals
from django.test import override_settings
from rest_framework.authentication import SessionAuthentication
from rest_framework.throttling import AnonRateThrottle
from rest_framework.versioning import URLPathVersioning

from tasks.api import auth, direct
from tasks.api.auth import ApiKeyAuthentication, api_key_create
from tasks.models import ApiKey, Task
from tests.asgi_calls import Request, assert_api_error, bearer, call, served
from valka import asgi
from valka_sdk.tracing import TRACEPARENT

pytestmark = pytest.mark.django_db(transaction=True)

TIMES = ("run_at", "scheduled_at", "created_at", "updated_at")
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def key() -> str:
    return api_key_create(name="direct")[1]


@pytest.fixture
def paths() -> list[str]:
    """Which path answered each request: "direct" (in a web thread), "loop" (on the event loop), or
    "stack" (Django's WSGI handler)."""
    taken: list[str] = []

    def started(sender: Any, **kwargs: Any) -> None:
        taken.append({direct.create: "direct", direct.create_on_loop: "loop"}.get(sender, "stack"))

    signals.request_started.connect(started, weak=False)
    yield taken
    signals.request_started.disconnect(started)


def both(monkeypatch, body: dict | bytes, headers: dict[str, str], **kwargs: Any) -> tuple[Request, Request]:
    """The request through the app as it is, then again with the direct path off."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    on = call(Request(body=raw), headers=headers, **kwargs)
    with monkeypatch.context() as patched:
        patched.setattr(direct, "ENABLED", False)
        off = call(Request(body=raw), headers=headers, **kwargs)
    return on, off


def same_answer(on: Request, off: Request, *, ignore: tuple[str, ...] = ()) -> None:
    """The same status, headers and body; `ignore`d fields of the body (ids, times) may differ."""
    assert on.status == off.status, (on.messages, off.messages)
    assert sorted(on.messages[0]["headers"]) == sorted(off.messages[0]["headers"])
    if not ignore:
        assert on.messages[1:] == off.messages[1:]
        return
    first, second = on.json(), off.json()
    for field in ignore:
        first.pop(field), second.pop(field)
    assert first == second


def test_a_create_is_answered_directly_as_the_stack_answers_it(monkeypatch, key, paths):
    body = {"task_name": "t", "queue": "q", "input": {"n": 1}, "metadata": {"m": "x"}, "priority": 3}
    on, off = both(monkeypatch, body, bearer(key))
    assert paths == ["direct", "stack"]
    assert on.status == 201
    same_answer(on, off, ignore=("id", "task_id", *TIMES))
    task = Task.objects.get(id=on.json()["id"])
    assert (task.task_name, task.queue, task.input, task.metadata, task.priority) == ("t", "q", {"n": 1}, {"m": "x"}, 3)


def test_an_idempotency_key_held_answers_200_with_its_task(monkeypatch, key, paths):
    first = call(Request(body=json.dumps({"task_name": "t", "queue": "q", "idempotency_key": "k"}).encode()),
                 headers=bearer(key))
    on, off = both(monkeypatch, {"task_name": "t", "queue": "q", "idempotency_key": "k"}, bearer(key))
    assert paths == ["direct", "direct", "stack"]
    assert (first.status, on.status) == (201, 200)
    same_answer(on, off)
    assert on.json() == first.json() and Task.objects.count() == 1


def test_the_path_and_its_trailing_slash_both_go_direct(key, paths):
    request = call(Request(body=b'{"task_name": "t", "queue": "q"}'), "/api/v1/tasks/", headers=bearer(key))
    assert request.status == 201 and paths == ["direct"]


def test_a_traceparent_is_carried_as_the_middleware_carries_it(key, paths):
    request = call(Request(body=b'{"task_name": "t", "queue": "q"}'), headers={**bearer(key), "traceparent": CALLER})
    assert request.status == 201 and paths == ["direct"]
    assert Task.objects.get(id=request.json()["id"]).metadata == {TRACEPARENT: CALLER}


def test_the_key_use_is_noted(key, paths):
    assert ApiKey.objects.get().last_used_at is None
    call(Request(body=b'{"task_name": "t", "queue": "q"}'), headers=bearer(key))
    assert paths == ["direct"] and ApiKey.objects.get().last_used_at is not None


@pytest.mark.parametrize(("body", "headers", "query", "status"), [
    (b'{"task_name": ""}', {}, b"", 400),  # invalid: the stack names the field
    (b"[1, 2", {}, b"", 400),  # not JSON
    (b'{"task_name": "t", "priority": "high"}', {}, b"", 400),
    (b'{"task_name": "t", "queue": "q"}', {"accept": "text/html"}, b"", 406),
    (b'{"task_name": "t", "queue": "q"}', {"accept": "application/json; indent=4"}, b"", 201),
    (b'{"task_name": "t", "queue": "q"}', {"content-type": "text/plain"}, b"", 415),
    (b'{"task_name": "t", "queue": "q"}', {}, b"format=json", 201),
    (b'{"task_name": "t", "queue": "q"}', {"host": "elsewhere.example"}, b"", 400),  # not in ALLOWED_HOSTS
], ids=["invalid", "not-json", "bad-priority", "accept-html", "indent", "text-plain", "query", "host"])
def test_anything_but_the_plain_create_is_answered_by_the_stack(monkeypatch, key, paths, body, headers, query,
                                                                status):
    before = Task.objects.count()
    on, off = both(monkeypatch, body, {**bearer(key), **headers}, query=query)
    assert paths == ["direct", "stack", "stack"], "handed over, then the stack's own"
    assert on.status == status
    if status >= 400:
        same_answer(on, off)
        assert Task.objects.count() == before
    else:
        same_answer(on, off, ignore=("id", "task_id", *TIMES))


def test_a_key_whose_scope_falls_short_gets_the_stacks_403(monkeypatch, paths):
    _record, read_only = api_key_create(name="reader", scope=ApiKey.Scope.READ)
    on, off = both(monkeypatch, {"task_name": "t", "queue": "q"}, bearer(read_only))
    assert paths == ["direct", "stack", "stack"]
    assert_api_error(on, 403, "FORBIDDEN")
    same_answer(on, off)
    assert Task.objects.count() == 0


def test_an_unknown_key_is_refused_with_the_same_answer_as_before_a_large_body(paths):
    wrong = bearer("vk_wrong-0123456789abcdefghijklmnopqrstuvwxyzABCD")
    small = call(Request(body=b'{"task_name": "t", "queue": "q"}'), headers=wrong)
    large = call(Request(size=asgi.ANONYMOUS_BODY_LIMIT + 1), headers=wrong)
    assert paths == ["direct"]
    assert small.messages == large.messages and small.status == 401
    assert large.handed == 0 and Task.objects.count() == 0


def test_a_body_larger_than_the_direct_limit_takes_the_stack(key, paths):
    body = json.dumps({"task_name": "t", "queue": "q", "input": "x" * asgi.ANONYMOUS_BODY_LIMIT}).encode()
    request = call(Request(body=body), headers=bearer(key))
    assert request.status == 201 and paths == ["stack"]


def test_a_chunked_body_takes_the_stack(key, paths):
    request = call(Request(body=b'{"task_name": "t", "queue": "q"}'), headers=bearer(key), announce=False)
    assert request.status == 201 and paths == ["stack"]


def test_a_failure_after_the_insert_gets_djangos_500_and_no_second_insert(monkeypatch, key, paths):
    def broken(task: Task) -> dict:
        raise RuntimeError("the answer could not be made")

    monkeypatch.setattr(direct, "task_data", broken)
    given = str(uuid.uuid4())
    request = call(Request(body=json.dumps({"id": given, "task_name": "t", "queue": "q"}).encode()),
                   headers=bearer(key))
    assert request.status == 500 and paths == ["direct"]
    assert list(Task.objects.values_list("id", flat=True)) == [uuid.UUID(given)]


def test_middleware_it_does_not_stand_in_for_turns_it_off():
    assert direct._enabled()[0] is True
    with override_settings(MIDDLEWARE=["django.middleware.security.SecurityMiddleware", "some.audit.Middleware"]):
        assert direct._enabled() == (False, [])


@pytest.mark.parametrize(("attribute", "value"), [
    ("throttle_classes", [AnonRateThrottle]),
    ("authentication_classes", [SessionAuthentication, ApiKeyAuthentication]),
    ("versioning_class", URLPathVersioning),
])
def test_view_classes_it_does_not_stand_in_for_turn_it_off(monkeypatch, attribute, value):
    monkeypatch.setattr(direct.TaskViewSet, attribute, value)
    assert direct._enabled() == (False, [])


# -- On the event loop: the app served, with its lifespan, creates with a remembered key. --

def create(body: dict | bytes, headers: dict[str, str]) -> tuple[Request, dict[str, Any]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Request(body=raw), {"headers": headers}


def stack_answer(monkeypatch, body: dict | bytes, headers: dict[str, str]) -> Request:
    """The same request with the direct path off."""
    with monkeypatch.context() as patched:
        patched.setattr(direct, "ENABLED", False)
        return call(create(body, headers)[0], headers=headers)


def test_a_remembered_keys_create_is_made_on_the_event_loop_as_the_stack_makes_it(monkeypatch, key, paths):
    body = {"task_name": "t", "queue": "q", "input": {"n": 1}, "metadata": {"m": "x"}, "priority": 3}
    first, second = create(body, bearer(key)), create(body, bearer(key))
    served(first, second)
    assert paths == ["direct", "loop"], "the first looks its key up in a thread; the second's is remembered"
    off = stack_answer(monkeypatch, body, bearer(key))
    for on in (first[0], second[0]):
        assert on.status == 201
        same_answer(on, off, ignore=("id", "task_id", *TIMES))
    task = Task.objects.get(id=second[0].json()["id"])
    assert (task.task_name, task.queue, task.input, task.metadata, task.priority) == ("t", "q", {"n": 1}, {"m": "x"}, 3)
    assert second[0].json()["created_at"] == task.created_at.isoformat().replace("+00:00", "Z")


def test_on_the_event_loop_a_traceparent_is_carried(key, paths):
    traced = {**bearer(key), "traceparent": CALLER}
    body = {"task_name": "t", "queue": "q"}
    first, second = create(body, bearer(key)), create(body, traced)
    served(first, second)
    assert paths == ["direct", "loop"] and second[0].status == 201
    assert Task.objects.get(id=second[0].json()["id"]).metadata == {TRACEPARENT: CALLER}


def test_on_the_event_loop_a_held_idempotency_key_is_answered_by_the_stack(key, paths):
    body = {"task_name": "t", "queue": "q", "idempotency_key": "once"}
    first, second = create(body, bearer(key)), create(body, bearer(key))
    served(first, second)
    assert paths == ["direct", "loop", "stack"], "the INSERT wrote nothing: handed over with the key found"
    assert (first[0].status, second[0].status) == (201, 200)
    assert second[0].json()["id"] == first[0].json()["id"] and Task.objects.count() == 1


def test_on_the_event_loop_a_failure_after_the_insert_gets_djangos_500_and_no_second_insert(monkeypatch, key,
                                                                                             paths):
    given = str(uuid.uuid4())
    first = create({"task_name": "t", "queue": "q"}, bearer(key))
    second = create({"id": given, "task_name": "t", "queue": "q"}, bearer(key))
    real = direct.task_data

    def broken_for_the_second(task: Task) -> dict:
        if str(task.id) == given:
            raise RuntimeError("the answer could not be made")
        return real(task)

    monkeypatch.setattr(direct, "task_data", broken_for_the_second)
    served(first, second)
    assert paths == ["direct", "loop"] and (first[0].status, second[0].status) == (201, 500)
    assert Task.objects.filter(id=given).count() == 1 and Task.objects.count() == 2


def test_a_key_whose_use_is_due_to_be_noted_takes_a_web_thread(monkeypatch, key, paths):
    monkeypatch.setattr(auth, "USE_NOTED_EVERY", 0)  # every create is due to note its key's use: a write
    served(create({"task_name": "t", "queue": "q"}, bearer(key)), create({"task_name": "t", "queue": "q"}, bearer(key)))
    assert paths == ["direct", "direct"]
    assert ApiKey.objects.get().last_used_at is not None and Task.objects.count() == 2
