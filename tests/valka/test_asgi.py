"""The ASGI entry (valka.asgi) and request bodies: a caller the REST API would refuse is refused
before its body is read (but for a create's small body, tests/tasks/api/test_direct.py), the size
limit applies while the body arrives, and nothing blocking
(a temporary file) runs on the event loop. Driven with hand-made scope, receive and send.

The requests run on the app's web threads, on connections of their own: the rows a test makes
must be committed, hence `django_db(transaction=True)`."""

from __future__ import annotations

import asyncio
import json
import tempfile
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.test import Client

from tasks.api.auth import api_key_create
from tasks.models import Task
from tests.asgi_calls import CHUNK, Request, assert_api_error, bearer, call
from valka import asgi

pytestmark = pytest.mark.django_db(transaction=True)

KiB = 1024
MiB = 1024 * KiB
TASK = json.dumps({"task_name": "t", "queue": "q"}).encode()


@pytest.fixture
def key() -> str:
    return api_key_create(name="asgi")[1]


@pytest.fixture
def temp_files(monkeypatch) -> list[bool]:
    """Every temporary file the app makes, as whether it was made on the event loop's thread."""
    made: list[bool] = []
    for name in ("TemporaryFile", "SpooledTemporaryFile", "NamedTemporaryFile"):
        real = getattr(tempfile, name)

        def spy(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
                made.append(True)
            except RuntimeError:
                made.append(False)
            return _real(*args, **kwargs)

        monkeypatch.setattr(tempfile, name, spy)
    return made


# -- No credential, or a wrong one: 401 before the body is read. --

@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "chunked"])
def test_a_caller_without_credentials_is_refused_before_the_body_is_read(announce, temp_files):
    request = call(Request(size=10 * MiB), announce=announce)
    body = assert_api_error(request, 401, "UNAUTHORIZED")
    assert request.headers[b"www-authenticate"] == b"Bearer"
    assert body["details"] == {}
    assert request.handed == 0 and request.calls == 0, "not a byte of the body read"
    assert temp_files == [] and Task.objects.count() == 0


SECURITY_HEADERS = (b"x-frame-options", b"referrer-policy", b"cross-origin-opener-policy",
                    b"x-content-type-options")


@pytest.mark.parametrize("early", ["no credentials", "unknown key, small create", "body too large"])
def test_answers_given_before_django_carry_its_security_headers(early):
    """A 401 or 413 answered before Django sees the request has the headers the security middleware
    gives Django's own answers (here a 401 from the API's authentication)."""
    django_answer = call(Request(), path="/api/v1/tasks", method="GET")
    assert django_answer.status == 401
    request = {
        "no credentials": lambda: call(Request(size=10 * MiB)),
        "unknown key, small create": lambda: call(
            Request(body=TASK), headers=bearer("vk_not-a-key-0123456789abcdefghijklmnopqrstuv")),
        "body too large": lambda: call(Request(size=10 * MiB), path="/admin/login/"),
    }[early]()
    assert request.status == (413 if early == "body too large" else 401)
    expected = {name: django_answer.headers[name] for name in SECURITY_HEADERS}
    assert expected[b"x-frame-options"] == b"DENY" and expected[b"x-content-type-options"] == b"nosniff"
    assert {name: request.headers.get(name) for name in SECURITY_HEADERS} == expected


@pytest.mark.parametrize("authorization", [
    "Bearer vk_wrong-0123456789abcdefghijklmnopqrstuvwxyzABCD",  # no such key
    "Bearer ",
    "Basic dXNlcjpwYXNz",
])
def test_a_wrong_key_is_refused_before_the_body_is_read(authorization, key, temp_files):
    request = call(Request(size=10 * MiB), headers={"Authorization": authorization}, announce=False)
    body = assert_api_error(request, 401, "UNAUTHORIZED")
    assert request.headers[b"www-authenticate"] == b"Bearer"
    assert request.handed == 0 and request.calls == 0
    for secret in ("wrong-0123", "dXNlcjpwYXNz", "vk_"):
        assert secret not in json.dumps(body)
    assert temp_files == [] and Task.objects.count() == 0


@pytest.mark.parametrize("size", [10 * MiB, len(TASK)], ids=["large", "small"])
def test_a_revoked_key_is_refused(size):
    """Before a large body is read; a small one to the create is read first, and the key looked up
    in the same hand-over to a web thread (tasks.api.direct)."""
    record, key = api_key_create(name="old")
    record.revoked = True
    record.save()
    request = call(Request(size=size, body=TASK if size == len(TASK) else None), headers=bearer(key))
    assert_api_error(request, 401, "UNAUTHORIZED")
    assert request.headers[b"www-authenticate"] == b"Bearer"
    assert request.handed == (0 if size > asgi.ANONYMOUS_BODY_LIMIT else size) and Task.objects.count() == 0


def test_the_key_look_up_holds_no_database_connection_afterwards():
    app = asgi.Application(threads=1)  # one web thread: the one that looked the key up
    try:
        request = call(Request(body=TASK), headers=bearer("vk_not-a-key-0123456789abcdefghijklmnopqrstuv"), app=app)
        assert_api_error(request, 401, "UNAUTHORIZED")
        assert app.executor.submit(lambda: connections["default"].connection).result() is None
    finally:
        app.executor.shutdown()


def test_an_event_stream_with_a_body_is_refused_likewise():
    request = call(Request(size=10 * MiB), "/api/v1/events", announce=False)
    assert_api_error(request, 401, "UNAUTHORIZED")
    assert request.handed == 0


# -- The size limit, applied as the body arrives. --

def test_a_body_past_the_limit_is_413_as_soon_as_it_passes_it(key, temp_files):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    request = call(Request(size=10 * MiB), headers=bearer(key), announce=False)
    body = assert_api_error(request, 413, "PAYLOAD_TOO_LARGE")
    assert str(limit) in body["message"] and "body" in body["details"]
    assert limit < request.handed <= limit + CHUNK, "reading stopped with the chunk that passed the limit"
    assert request.calls == -(-request.handed // CHUNK), "and receive() not called again"
    assert temp_files == [] and Task.objects.count() == 0


def test_a_content_length_past_the_limit_is_413_with_nothing_read(key):
    request = call(Request(size=settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1), headers=bearer(key))
    assert_api_error(request, 413, "PAYLOAD_TOO_LARGE")
    assert request.handed == 0 and request.calls == 0


def test_a_body_of_exactly_the_limit_is_read(key):
    request = call(Request(size=settings.DATA_UPLOAD_MAX_MEMORY_SIZE), headers=bearer(key), announce=False)
    assert request.handed == settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert_api_error(request, 400, "VALIDATION_ERROR")  # read, and found not to be JSON


def test_the_limit_holds_outside_the_api_too():
    request = call(Request(size=10 * MiB), "/admin/login/", announce=False)
    assert request.status == 413 and request.headers[b"content-type"].startswith(b"text/plain")
    assert request.handed <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE + CHUNK


# -- Callers the API takes. --

def test_a_valid_key_and_a_normal_body_create_the_task(key, temp_files):
    request = call(Request(body=TASK), headers=bearer(key))
    assert request.status == 201, request.messages
    assert Task.objects.filter(id=request.json()["id"]).exists()
    assert request.handed == len(TASK)
    assert temp_files == []


def test_a_chunked_body_gets_its_real_length(key):
    request = call(Request(body=TASK), headers=bearer(key), announce=False)
    assert request.status == 201, request.messages


def test_a_body_past_the_memory_limit_is_spilled_in_a_thread(key, settings, temp_files):
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 100 * KiB
    body = json.dumps({"task_name": "t", "queue": "q", "input": {"pad": "x" * (300 * KiB)}}).encode()
    request = call(Request(body=body), headers=bearer(key))
    assert request.status == 201, request.messages
    assert Task.objects.get(id=request.json()["id"]).input == {"pad": "x" * (300 * KiB)}
    assert temp_files == [False], "one temporary file, made off the event loop"


def test_anonymous_mode_takes_a_caller_without_credentials(settings):
    settings.VALKA = {**settings.VALKA, "API_ANONYMOUS": True}
    request = call(Request(body=TASK))
    assert request.status == 201, request.messages
    assert request.handed == len(TASK) and Task.objects.count() == 1


def test_a_session_goes_on_to_django_which_checks_its_csrf_token(django_user_model):
    user = django_user_model.objects.create_user("ops", is_staff=True)
    browser = Client()
    browser.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}"
    request = call(Request(body=TASK), headers={"Cookie": cookie})
    body = assert_api_error(request, 403, "FORBIDDEN")
    assert "CSRF" in body["message"]
    assert request.handed == len(TASK), "read, for Django to judge"
    assert Task.objects.count() == 0


def session_cookie(user: Any = None) -> dict[str, str]:
    """The Cookie header of a session: `user`'s, signed in, or one without a user (as a page that
    only stores something in the session makes)."""
    browser = Client()
    if user is not None:
        browser.force_login(user)
    else:
        from django.contrib.sessions.backends.db import SessionStore

        store = SessionStore()
        store["seen"] = True
        store.save()
        browser.cookies[settings.SESSION_COOKIE_NAME] = store.session_key
    return {"Cookie": f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}"}


@pytest.mark.parametrize("cookie", ["made up", "no user"])
def test_a_session_without_a_user_is_refused_before_the_body_is_read(cookie):
    headers = session_cookie() if cookie == "no user" else {"Cookie": f"{settings.SESSION_COOKIE_NAME}=made-up"}
    request = call(Request(size=10 * MiB), headers=headers, announce=False)
    assert_api_error(request, 401, "UNAUTHORIZED")
    assert request.handed == 0 and request.calls == 0
    assert Task.objects.count() == 0


# -- Outside the API: a caller not signed in has a small body read at most. --

@pytest.mark.parametrize("cookie", ["none", "made up", "no user"])
def test_outside_the_api_a_caller_not_signed_in_has_a_small_body_read_at_most(cookie):
    headers = {"none": {}, "made up": {"Cookie": f"{settings.SESSION_COOKIE_NAME}=made-up"},
               "no user": session_cookie()}[cookie]
    request = call(Request(size=settings.DATA_UPLOAD_MAX_MEMORY_SIZE), "/admin/login/", headers=headers,
                   announce=False)
    assert request.status == 413 and str(asgi.ANONYMOUS_BODY_LIMIT).encode() in request.messages[1]["body"]
    assert asgi.ANONYMOUS_BODY_LIMIT < request.handed <= asgi.ANONYMOUS_BODY_LIMIT + CHUNK
    request = call(Request(size=asgi.ANONYMOUS_BODY_LIMIT + 1), "/admin/login/", headers=headers)
    assert request.status == 413 and request.handed == 0, "an announced length past it: nothing read"
    login = call(Request(body=b"username=a&password=b"), "/admin/login/", headers=headers)
    assert login.status != 413 and login.handed == len(b"username=a&password=b")


def test_outside_the_api_a_signed_in_user_has_the_whole_limit(django_user_model):
    headers = session_cookie(django_user_model.objects.create_user("ops", is_staff=True))
    request = call(Request(size=settings.DATA_UPLOAD_MAX_MEMORY_SIZE), "/admin/tasks/task/create/",
                   headers=headers, announce=False)
    assert request.status != 413 and request.handed == settings.DATA_UPLOAD_MAX_MEMORY_SIZE


# -- What the gate leaves alone. --

def test_requests_without_a_body_go_on_to_the_api_as_before(key):
    assert_api_error(call(Request(), method="GET"), 401, "UNAUTHORIZED")  # DRF's own answer
    request = call(Request(), method="GET", headers=bearer(key))
    assert request.status == 200 and request.json()["results"] == []


@pytest.mark.parametrize("path", ["/api/schema/", "/api/docs/", "/healthz", "/admin/login/"])
def test_public_pages_are_not_gated(path):
    request = call(Request(body=b"{}"), path)
    assert request.status != 401, request.messages
    assert request.handed == 2, "the body went on to Django"

