"""Authentication of the REST API and gRPC's ApiService: a key by default, and a refusal that
tells nothing: not the key sent, not whether any key exists, not whether a key was revoked.
Also the other ways in: anonymous mode, a staff session, a key from `manage.py create_api_key`."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connections
from rest_framework.test import APIClient

from tasks.api.auth import api_key_create, api_key_live_apart, bearer_key
from tasks.models import ApiKey, Task
from tests.helpers import assert_error
from valka_sdk.v1 import api_pb2, api_pb2_grpc

URL = "/api/v1/tasks"


def refusal(headers: dict[str, str], method: str = "get") -> tuple[int, dict, str]:
    client = APIClient()
    response = getattr(client, method)(URL, {"task_name": "t", "queue": "q"} if method == "post" else None,
                                       format="json", **headers)
    return response.status_code, response.json(), response.headers.get("WWW-Authenticate", "")


ATTEMPTS = {
    "no header": {},
    "empty bearer": {"HTTP_AUTHORIZATION": "Bearer "},
    "another scheme": {"HTTP_AUTHORIZATION": "Basic dXNlcjpwYXNz"},
    "unknown key": {"HTTP_AUTHORIZATION": "Bearer vk_unknown-key-0123456789abcdefghijklmnopqrstu"},
    "a key as a query parameter only": {"QUERY_STRING": "api_key=vk_in-the-url"},
}


@pytest.mark.parametrize(("header", "key"), [
    ("Bearer vk_abc", "vk_abc"), ("bearer  vk_abc ", "vk_abc"), ("BEARER vk_abc", "vk_abc"),
    ("Bearer ", None), ("Bearer", None), ("Basic dXNlcjpwYXNz", None), ("vk_abc", None), ("", None),
])
def test_every_way_in_reads_the_header_alike(header, key):
    """The one reading of `Authorization` that valka.asgi, the direct create, DRF and gRPC share."""
    assert bearer_key(header) == key


@pytest.mark.django_db
@pytest.mark.parametrize("attempt", list(ATTEMPTS))
def test_refusals_are_401_and_echo_nothing(attempt):
    status, body, challenge = refusal(ATTEMPTS[attempt], "post")
    assert status == 401 and set(body) == {"error", "message", "details"} and body["error"] == "UNAUTHORIZED"
    assert challenge == "Bearer"
    text = str(body)
    for secret in ("unknown-key", "dXNlcjpwYXNz", "in-the-url", "vk_"):
        assert secret not in text
    assert Task.objects.count() == 0


@pytest.mark.django_db
def test_the_answer_is_the_same_whether_keys_exist_or_not():
    wrong = {"HTTP_AUTHORIZATION": "Bearer vk_wrong-0123456789abcdefghijklmnopqrstuvwxyzABCD"}
    without_keys = refusal(wrong)
    record, key = api_key_create(name="real")
    # A key sharing the real one's stored prefix, and the real key once revoked.
    lookalike = {"HTTP_AUTHORIZATION": f"Bearer {key[:10]}-not-the-rest-of-it-0123456789abcdefgh"}
    with_keys = refusal(wrong)
    assert with_keys == without_keys == refusal(lookalike)
    assert key[:10] not in str(refusal(lookalike)[1])
    ApiKey.objects.filter(pk=record.pk).update(revoked=True)
    assert refusal({"HTTP_AUTHORIZATION": f"Bearer {key}"}) == without_keys


@pytest.mark.django_db
def test_a_failed_authentication_logs_no_key(caplog):
    caplog.set_level(logging.DEBUG)
    secret = "vk_logged-nowhere-0123456789abcdefghijklmnopqrstuvwxyz"
    assert refusal({"HTTP_AUTHORIZATION": f"Bearer {secret}"})[0] == 401
    assert caplog.records, "the refusal is logged (as Unauthorized)"
    for record in caplog.records:
        assert "logged-nowhere" not in record.getMessage()
        assert "logged-nowhere" not in str(record.__dict__)


@pytest.mark.django_db
def test_a_valid_key_works_and_stores_no_plain_text():
    record, key = api_key_create(name="svc")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get(URL).status_code == 200
    stored = ApiKey.objects.filter(pk=record.pk).values().get()
    assert not any(isinstance(v, str) and key in v for v in stored.values())
    assert len(key) >= 40, "about 256 bits of randomness"


@pytest.mark.django_db
def test_a_logged_in_non_staff_user_is_refused(django_user_model):
    django_user_model.objects.create_user("someone", password="pw-123456789")
    client = APIClient()
    assert client.login(username="someone", password="pw-123456789")
    r = client.get(URL)
    assert r.status_code == 403 and r.json()["error"] == "FORBIDDEN"


@pytest.mark.django_db
def test_staff_sessions_need_the_csrf_token_to_write(django_user_model):
    ops = django_user_model.objects.create_user("ops", password="pw-123456789", is_staff=True)
    # The permissions the admin would require (tests/tasks/api/test_permissions.py covers the rest).
    ops.user_permissions.add(*Permission.objects.filter(content_type__app_label="tasks",
                                                        codename__in=["view_task", "add_task"]))
    client = APIClient(enforce_csrf_checks=True)
    assert client.login(username="ops", password="pw-123456789")
    assert client.get(URL).status_code == 200
    r = client.post(URL, {"task_name": "t", "queue": "q"}, format="json")
    assert r.status_code == 403 and r.json()["error"] == "FORBIDDEN" and "CSRF" in r.json()["message"]
    assert Task.objects.count() == 0



@pytest.mark.django_db
def test_auth_required_by_default(anon_client):
    for method, url in [("get", "/api/v1/tasks"), ("post", "/api/v1/tasks"), ("get", "/api/v1/dead-letters"),
                        ("get", "/api/v1/workers")]:
        r = getattr(anon_client, method)(url, {"task_name": "t", "queue": "q"}, format="json")
        assert_error(r, 401, "UNAUTHORIZED")
    assert Task.objects.count() == 0


@pytest.mark.django_db
def test_wrong_key_is_401_and_leaks_nothing(anon_client, api_key):
    anon_client.credentials(HTTP_AUTHORIZATION="Bearer vk_wrong")
    r = anon_client.get("/api/v1/tasks")
    assert_error(r, 401, "UNAUTHORIZED")
    assert "vk_" not in r.content.decode().replace("vk_wrong", "")


@pytest.mark.django_db
def test_keys_are_stored_hashed(api_key):
    record = ApiKey.objects.get()
    assert api_key not in (record.key_hash, record.prefix) and len(record.key_hash) == 64


@pytest.mark.django_db
def test_anonymous_mode(anon_client, settings):
    settings.VALKA = {**settings.VALKA, "API_ANONYMOUS": True}
    assert anon_client.get("/api/v1/tasks").status_code == 200


@pytest.mark.django_db
def test_anonymous_mode_still_holds_a_key_sent_to_its_scope(anon_client, settings):
    """`make run` opens the API to callers without a key; one that sends a key gets what the key
    allows, as in production: a read key cannot write, a wrong key is 401."""
    settings.VALKA = {**settings.VALKA, "API_ANONYMOUS": True}
    body = {"task_name": "t", "queue": "q"}
    assert anon_client.post("/api/v1/tasks", body, format="json").status_code == 201
    anon_client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(name='reader', scope='read')[1]}")
    r = anon_client.post("/api/v1/tasks", body, format="json")
    assert_error(r, 403, "FORBIDDEN")
    assert anon_client.get("/api/v1/tasks").status_code == 200
    anon_client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(name='writer')[1]}")
    assert anon_client.post("/api/v1/tasks", body, format="json").status_code == 201
    anon_client.credentials(HTTP_AUTHORIZATION="Bearer vk_wrong")
    assert_error(anon_client.post("/api/v1/tasks", body, format="json"), 401, "UNAUTHORIZED")
    assert_error(anon_client.get("/api/v1/events"), 401, "UNAUTHORIZED")
    assert Task.objects.count() == 2


@pytest.mark.django_db
def test_staff_session_works(anon_client, django_user_model):
    user = django_user_model.objects.create_user("ops", password="pw-123456", is_staff=True)
    user.user_permissions.add(Permission.objects.get(content_type__app_label="tasks", codename="view_task"))
    anon_client.force_login(user)
    assert anon_client.get("/api/v1/tasks").status_code == 200
    plain = django_user_model.objects.create_user("plain", password="pw-123456")
    anon_client.force_login(plain)
    assert anon_client.get("/api/v1/tasks").status_code in (401, 403)


@pytest.mark.django_db
def test_create_api_key_command_prints_key_last(capsys, anon_client):
    call_command("create_api_key", "ci")
    key = capsys.readouterr().out.strip().splitlines()[-1]
    anon_client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert anon_client.get("/api/v1/tasks").status_code == 200

def test_grpc_api_service_needs_a_key(stack):
    _, addr = stack.dispatcher(VALKA_API_ANONYMOUS="false")
    _, key = api_key_create(name="grpc")
    record, revoked = api_key_create(name="gone")
    ApiKey.objects.filter(pk=record.pk).update(revoked=True)
    request = api_pb2.CreateTaskRequest(queue_name="q", task_name="t")
    with grpc.insecure_channel(addr) as channel:
        api = api_pb2_grpc.ApiServiceStub(channel)
        answers = []
        for metadata in [None, (("authorization", "Bearer vk_wrong"),), (("authorization", f"Bearer {revoked}"),),
                         (("authorization", key),)]:
            with pytest.raises(grpc.RpcError) as err:
                api.CreateTask(request, metadata=metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            answers.append(err.value.details())
            assert "vk_" not in err.value.details()
        assert len(set(answers)) == 1, "every refusal reads the same"
        for call in (lambda: api.GetTask(api_pb2.GetTaskRequest(task_id="x")),
                     lambda: api.ListTasks(api_pb2.ListTasksRequest()),
                     lambda: next(api.SubscribeEvents(api_pb2.SubscribeEventsRequest()))):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert Task.objects.count() == 0
        created = api.CreateTask(request, metadata=(("authorization", f"Bearer {key}"),)).task
        assert str(Task.objects.get().id) == created.id


def test_grpc_anonymous_mode_still_holds_a_key_sent_to_its_scope(stack):
    _, addr = stack.dispatcher()  # the stack's default: anonymous calls allowed, as under `make run`
    _, reader = api_key_create(name="reader", scope="read")
    request = api_pb2.CreateTaskRequest(queue_name="q", task_name="t")
    with grpc.insecure_channel(addr) as channel:
        api = api_pb2_grpc.ApiServiceStub(channel)
        created = api.CreateTask(request).task
        for metadata, code in [((("authorization", f"Bearer {reader}"),), grpc.StatusCode.PERMISSION_DENIED),
                               ((("authorization", "Bearer vk_wrong"),), grpc.StatusCode.UNAUTHENTICATED)]:
            with pytest.raises(grpc.RpcError) as err:
                api.CreateTask(request, metadata=metadata)
            assert err.value.code() == code
        assert api.ListTasks(api_pb2.ListTasksRequest(), metadata=(("authorization", f"Bearer {reader}"),)).tasks
    assert [str(t.id) for t in Task.objects.all()] == [created.id]


@pytest.mark.django_db(transaction=True)  # looked up on another connection: the key must be committed
@pytest.mark.parametrize("pooled", [True, False], ids=["pool", "no-pool"])
def test_the_look_up_apart_finds_live_keys_and_leaves_no_connection_behind(pooled, monkeypatch):
    """valka.asgi's look-up before a body is read: through Django's pool straight, or (the pool off)
    on Django's connection, closed afterwards; either way the thread holds no connection after it."""
    wrapper = type(connections["default"])
    assert (wrapper.pool.fget(connections["default"]) is not None) or not pooled, "the tests run with the pool"
    record, key = api_key_create(name="apart")

    def look_up(plain: str) -> tuple[ApiKey | None, object]:
        return api_key_live_apart(plain), connections["default"].connection

    with monkeypatch.context() as patch, ThreadPoolExecutor(1) as thread:
        if not pooled:  # for the look-up's thread only: undone before this test's connection closes
            patch.setattr(wrapper, "pool", property(lambda self: None))
        found, held = thread.submit(look_up, key).result()
        assert found is not None and found.pk == record.pk and found.scope == record.scope
        assert held is None
        assert thread.submit(look_up, "vk_not-a-key").result() == (None, None)
        ApiKey.objects.filter(pk=record.pk).update(revoked=True)
        assert thread.submit(look_up, key).result() == (None, None)
