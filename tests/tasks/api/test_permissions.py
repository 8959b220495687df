"""Who may call which endpoint: every endpoint of the REST API (its event streams included) for
each kind of caller. A staff session has exactly the permissions the admin requires for the same
action; an API key its scope (read < write < admin)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from signals.models import Signal
from tasks.api.auth import api_key_create
from tasks.models import ApiKey, DeadLetter, Queue, Task
from tests.factories import DeadLetterFactory, SignalFactory, TaskFactory, TaskLogFactory, TaskRunFactory
from valka_sdk.v1 import api_pb2, api_pb2_grpc

READ, WRITE, ADMIN = ApiKey.Scope.READ, ApiKey.Scope.WRITE, ApiKey.Scope.ADMIN


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: Callable[[], str]  # builds the rows the call acts on, and answers its path
    permission: str  # what a staff session needs
    scope: str  # what a key needs
    body: dict | None = None
    done: Callable[[], bool] = lambda: True  # the call's write happened (False: nothing written)
    stream: bool = False


def _task_path(suffix: str = "", **fields) -> Callable[[], str]:
    return lambda: f"/api/v1/tasks/{TaskFactory(**fields).id}{suffix}"


def _run_path(suffix: str) -> Callable[[], str]:
    def build() -> str:
        log = TaskLogFactory(run__status="COMPLETED", run__task__status="COMPLETED")
        return f"/api/v1/tasks/{log.task_id}/runs/{log.run_id}{suffix}"
    return build


def _queue_path(suffix: str = "", **settings) -> Callable[[], str]:
    def build() -> str:
        TaskFactory(queue="perm-q")  # its row is made with it
        Queue.objects.filter(name="perm-q").update(**settings)
        return f"/api/v1/queues/perm-q{suffix}"
    return build


def _queue_has(**settings) -> Callable[[], bool]:
    return lambda: Queue.objects.filter(name="perm-q", **settings).exists()


ENDPOINTS = {
    "list tasks": Endpoint("get", lambda: "/api/v1/tasks", "tasks.view_task", READ),
    "get a task": Endpoint("get", _task_path(), "tasks.view_task", READ),
    "list runs": Endpoint("get", lambda: f"/api/v1/tasks/{TaskRunFactory().task_id}/runs", "tasks.view_task", READ),
    "read a run's log": Endpoint("get", _run_path("/logs"), "tasks.view_task", READ),
    "tail a run's log": Endpoint("get", _run_path("/logs/stream"), "tasks.view_task", READ, stream=True),
    "stream events": Endpoint("get", lambda: "/api/v1/events", "tasks.view_task", READ, stream=True),
    "create a task": Endpoint("post", lambda: "/api/v1/tasks", "tasks.add_task", WRITE,
                              {"task_name": "made", "queue": "q"},
                              lambda: Task.objects.filter(task_name="made").exists()),
    "create a batch": Endpoint("post", lambda: "/api/v1/tasks/batch", "tasks.add_task", WRITE,
                               {"tasks": [{"task_name": "made", "queue": "q"}]},
                               lambda: Task.objects.filter(task_name="made").exists()),
    "cancel a task": Endpoint("post", _task_path("/cancel"), "tasks.cancel_task", WRITE, {},
                              lambda: Task.objects.filter(status="CANCELLED").exists()),
    "delete a task": Endpoint("delete", _task_path(status="COMPLETED"), "tasks.delete_task", ADMIN,
                              done=lambda: not Task.objects.exists()),
    "list dead letters": Endpoint("get", lambda: "/api/v1/dead-letters", "tasks.view_deadletter", READ),
    "get a dead letter": Endpoint("get", lambda: f"/api/v1/dead-letters/{DeadLetterFactory().id}",
                                  "tasks.view_deadletter", READ),
    "replay a dead letter": Endpoint("post", lambda: f"/api/v1/dead-letters/{DeadLetterFactory().id}/replay",
                                     "tasks.replay_deadletter", WRITE, {},
                                     lambda: Task.objects.filter(status="PENDING").exists()),
    "list workers": Endpoint("get", lambda: "/api/v1/workers", "tasks.view_worker", READ),
    "list queues": Endpoint("get", lambda: "/api/v1/queues", "tasks.view_queue", READ),
    "get a queue": Endpoint("get", _queue_path(), "tasks.view_queue", READ),
    "pause a queue": Endpoint("post", _queue_path("/pause"), "tasks.pause_queue", WRITE, {},
                              _queue_has(paused=True)),
    "resume a queue": Endpoint("post", _queue_path("/resume", paused=True), "tasks.pause_queue", WRITE, {},
                               _queue_has(paused=False)),
    "change a queue's limits": Endpoint("patch", _queue_path(), "tasks.change_queue", ADMIN, {"max_running": 3},
                                        _queue_has(max_running=3)),
    "send a signal": Endpoint("post", _task_path("/signal", status="RUNNING"), "signals.add_signal", WRITE,
                              {"signal_type": "stop"}, lambda: Signal.objects.exists()),
    "list a task's signals": Endpoint("get", lambda: f"/api/v1/tasks/{SignalFactory().task_id}/signals",
                                      "signals.view_signal", READ),
    "get a signal": Endpoint("get", lambda: f"/api/v1/signals/{SignalFactory().id}", "signals.view_signal", READ),
}
VIEW_ONLY = ("tasks.view_task", "tasks.view_deadletter", "tasks.view_worker", "tasks.view_queue",
             "signals.view_signal")


def _staff(django_user_model, perms, superuser: bool = False) -> Client:
    user = django_user_model.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", is_staff=True,
                                                 is_superuser=superuser)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = Client()
    client.force_login(user)
    return client


def _keyed(scope: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {api_key_create(name=f'{scope} key', scope=scope)[1]}")


def _call(client: Client, endpoint: Endpoint) -> int:
    path = endpoint.path()
    if endpoint.body is None:
        response = getattr(client, endpoint.method)(path)
    else:
        response = getattr(client, endpoint.method)(path, endpoint.body, content_type="application/json")
    if response.streaming:
        response.close()  # an allowed stream is open: its status is the answer
    return response.status_code


CALLERS = {
    "anonymous": lambda users: Client(),
    "view-only staff": lambda users: _staff(users, VIEW_ONLY),
    "full staff": lambda users: _staff(users, (), superuser=True),
    "read key": lambda users: _keyed(READ),
    "write key": lambda users: _keyed(WRITE),
    "admin key": lambda users: _keyed(ADMIN),
}


def _allowed(caller: str, endpoint: Endpoint) -> bool | None:
    """True: the call succeeds; False: 403; None: 401 (no credential)."""
    if caller == "anonymous":
        return None
    if caller == "full staff":
        return True
    if caller == "view-only staff":
        return endpoint.permission in VIEW_ONLY
    return ApiKey(scope=caller.split()[0]).allows(endpoint.scope)


# The streams read in threads of their own, whose connections see only committed rows.
NAMES = [pytest.param(name, marks=pytest.mark.django_db(transaction=ENDPOINTS[name].stream)) for name in ENDPOINTS]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("caller", list(CALLERS))
def test_every_endpoint_for_every_caller(caller, name, django_user_model):
    endpoint = ENDPOINTS[name]
    status = _call(CALLERS[caller](django_user_model), endpoint)
    allowed = _allowed(caller, endpoint)
    if allowed is None:
        assert status == 401
    elif allowed:
        assert status in (200, 201, 204), status
        assert endpoint.done()
    else:
        assert status == 403
        if endpoint.method != "get":
            assert not endpoint.done(), "a refused call wrote"


@pytest.mark.parametrize("name", NAMES)
def test_a_staff_session_needs_exactly_the_admins_permission(name, django_user_model):
    """Holding every other permission of the project does not stand in for the one the action needs."""
    endpoint = ENDPOINTS[name]
    everything = [f"{p.content_type.app_label}.{p.codename}"
                  for p in Permission.objects.filter(content_type__app_label__in=["tasks", "signals"])]
    assert endpoint.permission in everything
    assert _call(_staff(django_user_model, [endpoint.permission]), endpoint) in (200, 201, 204)
    assert endpoint.done()
    others = [perm for perm in everything if perm != endpoint.permission]
    assert _call(_staff(django_user_model, others), endpoint) == 403


@pytest.mark.django_db
def test_a_refusal_names_what_is_missing(django_user_model):
    body = _staff(django_user_model, VIEW_ONLY).post(
        "/api/v1/tasks", {"task_name": "t", "queue": "q"}, content_type="application/json").json()
    assert body["error"] == "FORBIDDEN" and "tasks.add_task" in body["message"]
    body = _keyed(WRITE).delete(f"/api/v1/tasks/{TaskFactory(status='COMPLETED').id}").json()
    assert body["error"] == "FORBIDDEN" and "admin" in body["message"] and "write" in body["message"]
    assert Task.objects.count() == 1 and DeadLetter.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_revoked_key_is_refused_whatever_its_scope():
    record, key = api_key_create(name="gone", scope=ADMIN)
    caller = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert caller.get("/api/v1/tasks").status_code == 200
    ApiKey.objects.filter(pk=record.pk).update(revoked=True)
    assert caller.get("/api/v1/tasks").status_code == 401
    assert caller.get("/api/v1/events").status_code == 401


def test_grpc_api_service_checks_the_same_scopes(stack):
    """gRPC's ApiService is the REST API's twin: a read key reads and is refused writes (PERMISSION_DENIED,
    nothing written); a write key writes."""
    _, addr = stack.dispatcher(VALKA_API_ANONYMOUS="false")
    running = TaskFactory(status="RUNNING")
    keys = {scope: (("authorization", f"Bearer {api_key_create(name=scope, scope=scope)[1]}"),)
            for scope in (READ, WRITE)}
    with grpc.insecure_channel(addr) as channel:
        api = api_pb2_grpc.ApiServiceStub(channel)
        calls = {
            "create": lambda key: api.CreateTask(api_pb2.CreateTaskRequest(queue_name="q", task_name="made"),
                                                 metadata=key),
            "signal": lambda key: api.SendSignal(api_pb2.SendSignalRequest(task_id=str(running.id),
                                                                           signal_name="stop"), metadata=key),
            "cancel": lambda key: api.CancelTask(api_pb2.CancelTaskRequest(task_id=str(running.id)), metadata=key),
        }
        assert api.GetTask(api_pb2.GetTaskRequest(task_id=str(running.id)), metadata=keys[READ]).task.id == str(
            running.id)
        assert len(api.ListTasks(api_pb2.ListTasksRequest(), metadata=keys[READ]).tasks) == 1
        for name, call in calls.items():
            with pytest.raises(grpc.RpcError) as err:
                call(keys[READ])
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
            assert "write" in err.value.details()
        assert Task.objects.count() == 1 and not Signal.objects.exists()
        assert Task.objects.get(pk=running.pk).status == "RUNNING"
        for call in calls.values():
            call(keys[WRITE])
        assert Task.objects.filter(task_name="made").exists() and Signal.objects.exists()
        assert Task.objects.get(pk=running.pk).status == "CANCELLED"
