"""The REST API of schedules: happy paths, every bad input (400 naming the field, nothing written),
declared schedules, who may call what, and the OpenAPI schema."""

from __future__ import annotations

import uuid
from datetime import datetime

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from schedules import services
from schedules.models import Schedule
from schedules.slots import zone
from tasks.api.auth import api_key_create
from tasks.models import ApiKey, Task
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

BODY = {"name": "nightly-report", "cron": "30 2 * * *", "timezone": "Europe/Berlin", "task_name": "report",
        "queue": "reports", "input": {"kind": "daily"}, "metadata": {"team": "ops"}, "priority": 2}


def test_create_read_change_trigger_delete(client_api):
    made = client_api.post("/api/v1/schedules", BODY, format="json")
    assert made.status_code == 201, made.content
    body = made.json()
    assert {k: body[k] for k in BODY} == BODY
    assert body["interval_seconds"] is None and body["catch_up"] == "latest" and body["enabled"] is True
    assert body["declared"] is False and body["last_run_at"] is None and body["last_task_id"] is None
    assert len(body["upcoming"]) == 5 and body["upcoming"][0] == body["next_run_at"]
    slots = [datetime.fromisoformat(s) for s in body["upcoming"]]
    assert slots == sorted(slots) and all(s.astimezone(zone("Europe/Berlin")).strftime("%H:%M") in
                                          ("02:30", "03:00") for s in slots)

    got = client_api.get("/api/v1/schedules/nightly-report").json()
    assert got["name"] == "nightly-report" and got["next_run_at"] == body["next_run_at"]
    page = client_api.get("/api/v1/schedules?enabled=true&queue=reports").json()
    assert page["count"] == 1 and page["results"][0]["name"] == "nightly-report" and not page["has_more"]
    assert client_api.get("/api/v1/schedules?enabled=false").json()["count"] == 0

    changed = client_api.patch("/api/v1/schedules/nightly-report", {"cron": None, "interval_seconds": 3600,
                                                                    "enabled": False}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["interval_seconds"] == 3600 and changed.json()["cron"] is None
    assert changed.json()["enabled"] is False and len(changed.json()["upcoming"]) == 5

    fired = client_api.post("/api/v1/schedules/nightly-report/trigger")
    assert fired.status_code == 201, fired.content
    task = fired.json()
    prefix, manual = task["idempotency_key"].rsplit(":", 1)
    assert prefix == "schedule:nightly-report:manual" and str(uuid.UUID(manual)) == manual
    assert task["status"] == "PENDING"
    assert task["metadata"] == {"team": "ops", "valka.schedule": "nightly-report"} and task["priority"] == 2
    again = client_api.get("/api/v1/schedules/nightly-report").json()
    assert again["last_task_id"] == task["id"] and again["last_task_status"] == "PENDING"

    assert client_api.delete("/api/v1/schedules/nightly-report").status_code == 204
    assert not Schedule.objects.exists() and Task.objects.filter(id=task["id"]).exists()
    assert_error(client_api.get("/api/v1/schedules/nightly-report"), 404, "NOT_FOUND")
    assert_error(client_api.post("/api/v1/schedules/nope/trigger"), 404, "NOT_FOUND")


def test_an_interval_schedule_and_the_queue_name_alias(client_api):
    made = client_api.post("/api/v1/schedules", {"name": "tick", "interval_seconds": 1, "task_name": "t",
                                                 "queue_name": "fast", "catch_up": "all"}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["queue"] == "fast" and made.json()["interval_seconds"] == 1
    up = [datetime.fromisoformat(s) for s in made.json()["upcoming"]]
    assert [(b - a).total_seconds() for a, b in zip(up, up[1:], strict=False)] == [1.0] * 4


@pytest.mark.parametrize(("change", "field"), [
    ({"cron": "every day"}, "cron"),
    ({"cron": "60 * * * *"}, "cron"),
    ({"cron": "@fortnightly"}, "cron"),
    ({"timezone": "Europe/Gotham"}, "timezone"),
    ({"interval_seconds": 60}, "interval_seconds"),  # beside the cron
    ({"cron": None}, "cron"),  # neither
    ({"cron": None, "interval_seconds": 0}, "interval_seconds"),
    ({"cron": None, "interval_seconds": 0.5}, "interval_seconds"),
    ({"start_at": "2030-01-02T00:00:00Z", "end_at": "2030-01-01T00:00:00Z"}, "end_at"),
    ({"start_at": "tomorrow"}, "start_at"),
    ({"catch_up": "some"}, "catch_up"),
    ({"enabled": "yes"}, "enabled"),
    ({"task_name": None}, "task_name"),
    ({"queue": "has spaces"}, "queue"),
    ({"priority": "high"}, "priority"),
    ({"max_retries": -1}, "max_retries"),
    ({"timeout_seconds": 0}, "timeout_seconds"),
    ({"metadata": ["not", "an", "object"]}, "metadata"),
    ({"metadata": {"valka.schedule": "other"}}, "metadata"),
    ({"idempotency_key": "mine"}, "idempotency_key"),
    ({"run_at": "2030-01-01T00:00:00Z"}, "run_at"),
    ({"name": "no/slashes"}, "name"),
    ({"name": "x" * 201}, "name"),
    ({"cronn": "* * * * *"}, "cronn"),
])
def test_bad_input_is_refused_naming_the_field_and_writes_nothing(client_api, change, field):
    response = client_api.post("/api/v1/schedules", {**BODY, **change}, format="json")
    assert_error(response, 400, "VALIDATION_ERROR", field)
    assert not Schedule.objects.exists()


def test_a_bad_change_is_refused_and_leaves_the_schedule(client_api):
    client_api.post("/api/v1/schedules", BODY, format="json")
    before = Schedule.objects.get()
    for change, field in (({"cron": "1 2 3"}, "cron"), ({"timezone": "Nowhere"}, "timezone"),
                          ({"end_at": "2000-01-01T00:00:00Z", "start_at": "2001-01-01T00:00:00Z"}, "end_at"),
                          ({"name": "other"}, "name")):
        assert_error(client_api.patch("/api/v1/schedules/nightly-report", change, format="json"), 400,
                     "VALIDATION_ERROR", field)
    after = Schedule.objects.get()
    assert (after.cron, after.timezone, after.end_at, after.updated_at) == (before.cron, before.timezone, None,
                                                                           before.updated_at)


def test_a_taken_name_is_a_400_naming_name(client_api):
    assert client_api.post("/api/v1/schedules", BODY, format="json").status_code == 201
    assert_error(client_api.post("/api/v1/schedules", BODY, format="json"), 400, "VALIDATION_ERROR", "name")


def test_a_declared_schedule_takes_only_enabled(client_api):
    services.schedules_reconcile(entries=[{**BODY, "start_at": "2030-01-01T00:00:00+01:00"}])
    assert client_api.patch("/api/v1/schedules/nightly-report", {"enabled": False}, format="json").json()[
        "enabled"] is False
    body = client_api.get("/api/v1/schedules/nightly-report").json()  # sent back whole, times as text
    changed = client_api.patch("/api/v1/schedules/nightly-report", {**body, "enabled": True}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["enabled"] is True and changed.json()["next_run_at"] == body["next_run_at"]
    assert_error(client_api.patch("/api/v1/schedules/nightly-report", {"cron": "@daily"}, format="json"), 409,
                 "INVALID_STATE")
    assert_error(client_api.delete("/api/v1/schedules/nightly-report"), 409, "INVALID_STATE")
    assert Schedule.objects.get().cron == "30 2 * * *"


# -- Who may call what: a key's scope, or a staff session's permission (the admin's for the same action). --

READ, WRITE, ADMIN = ApiKey.Scope.READ, ApiKey.Scope.WRITE, ApiKey.Scope.ADMIN
CALLS = {  # name: (method, path, body, scope, permission, what a success left)
    "list": ("get", "/api/v1/schedules", None, READ, "schedules.view_schedule", None),
    "get": ("get", "/api/v1/schedules/s", None, READ, "schedules.view_schedule", None),
    "create": ("post", "/api/v1/schedules", {**BODY, "name": "new"}, WRITE, "schedules.add_schedule",
               lambda: Schedule.objects.filter(name="new").exists()),
    "change": ("patch", "/api/v1/schedules/s", {"enabled": False}, WRITE, "schedules.change_schedule",
               lambda: not Schedule.objects.get(name="s").enabled),
    "trigger": ("post", "/api/v1/schedules/s/trigger", None, WRITE, "schedules.trigger_schedule",
                lambda: Task.objects.exists()),
    "delete": ("delete", "/api/v1/schedules/s", None, ADMIN, "schedules.delete_schedule",
               lambda: not Schedule.objects.filter(name="s").exists()),
}


def _call(client: Client, name: str) -> int:
    method, path, body, *_ = CALLS[name]
    Schedule.objects.all().delete()
    Task.objects.all().delete()
    services.schedule_create(data={**BODY, "name": "s"})
    if body is None:
        return getattr(client, method)(path).status_code
    return getattr(client, method)(path, body, content_type="application/json").status_code


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("scope", [READ, WRITE, ADMIN])
def test_a_key_needs_the_scope(name, scope):
    needed, done = CALLS[name][3], CALLS[name][5]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_key_create(name='k', scope=scope)[1]}")
    status = _call(client, name)
    if ApiKey(scope=scope).allows(needed):
        assert status in (200, 201, 204) and (done is None or done())
    else:
        assert status == 403 and (done is None or not done())


@pytest.mark.parametrize("name", list(CALLS))
def test_a_staff_session_needs_exactly_the_admins_permission(name, staff_client):
    permission, done = CALLS[name][4], CALLS[name][5]
    everything = [f"schedules.{p.codename}" for p in Permission.objects.filter(content_type__app_label="schedules")]
    assert permission in everything
    assert _call(staff_client(*[p for p in everything if p != permission]), name) == 403
    assert done is None or not done()
    assert _call(staff_client(permission), name) in (200, 201, 204)
    assert done is None or done()
    assert _call(Client(), name) == 401


def test_the_schema_lists_the_endpoints(anon_client):
    paths = anon_client.get("/api/schema/?format=json").json()["paths"]
    assert {"/api/v1/schedules/", "/api/v1/schedules/{name}/", "/api/v1/schedules/{name}/trigger/"} <= set(paths)
    assert {"get", "patch", "delete"} <= set(paths["/api/v1/schedules/{name}/"])
    assert "upcoming" in anon_client.get("/api/schema/?format=json").json()["components"]["schemas"]["Schedule"][
        "properties"]
