"""GET /api/v1/queues, GET/PATCH /api/v1/queues/{name}, POST .../pause and .../resume: what each
answers, the NOTIFY that tells the dispatchers, and bad input (400 naming the field, nothing written)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tasks import services
from tasks.errors import ValidationError
from tasks.models import Queue, Worker
from tests.factories import TaskFactory
from tests.helpers import assert_error, db_now

pytestmark = pytest.mark.django_db

URL = "/api/v1/queues"
SETTINGS = ("paused", "paused_until", "max_running", "rate_limit", "rate_period_seconds", "max_running_per_key",
            "description")


def _row(name: str) -> dict:
    return Queue.objects.filter(name=name).values(*SETTINGS).get()


def test_the_list_has_every_queue_with_tasks_workers_or_settings(client_api):
    for status in ("PENDING", "PENDING", "RUNNING", "DISPATCHING", "COMPLETED"):
        TaskFactory(queue="emails", status=status, run_at=timezone.now() - timedelta(seconds=30))
    Worker.objects.create(id="w1", queues=["images"], concurrency=4)
    Queue.objects.create(name="configured", max_running=2)
    body = client_api.get(URL).json()
    assert (body["count"], body["has_more"], body["next"]) == (3, False, None)
    by_name = {q["name"]: q for q in body["results"]}
    assert list(by_name) == ["configured", "emails", "images"]
    emails = by_name["emails"]
    assert emails["counts"]["PENDING"] == 2 and emails["counts"]["COMPLETED"] == 1 and emails["counts_exact"]
    assert emails["running"] == 2, "DISPATCHING and RUNNING: what max_running holds"
    assert emails["lag_seconds"] >= 29 and emails["paused"] is False and emails["max_running"] is None
    assert by_name["configured"]["max_running"] == 2
    assert by_name["images"]["counts"]["PENDING"] == 0 and by_name["images"]["lag_seconds"] is None


def test_one_queue_and_an_unknown_one(client_api):
    TaskFactory(queue="q1")
    body = client_api.get(f"{URL}/q1").json()
    assert body["name"] == "q1" and body["rate_period_seconds"] == 1 and body["description"] == ""
    assert_error(client_api.get(f"{URL}/nope"), 404, "NOT_FOUND")
    assert_error(client_api.get(f"{URL}/bad%20name"), 404, "NOT_FOUND")
    assert not Queue.objects.filter(name="nope").exists()


def test_a_queue_whose_row_was_missed_reads_as_unlimited_and_gets_its_row_when_changed(client_api):
    TaskFactory(queue="late")
    Queue.objects.filter(name="late").delete()
    body = client_api.get(f"{URL}/late").json()
    assert body["name"] == "late" and body["max_running"] is None and body["paused"] is False
    assert not Queue.objects.filter(name="late").exists(), "a read writes nothing"
    assert client_api.patch(f"{URL}/late", {"max_running": 2}, format="json").json()["max_running"] == 2
    assert _row("late")["max_running"] == 2


@pytest.mark.django_db(transaction=True)  # the NOTIFY is heard once committed
def test_patch_sets_and_clears_limits_and_tells_the_dispatchers(client_api, listen):
    TaskFactory(queue="lim")
    heard = listen("valka_queue_changed")
    body = client_api.patch(f"{URL}/lim", {"max_running": 5, "rate_limit": 20, "rate_period_seconds": 2,
                                           "max_running_per_key": 1, "description": "the slow API"},
                            format="json").json()
    assert (body["max_running"], body["rate_limit"], body["rate_period_seconds"], body["max_running_per_key"],
            body["description"]) == (5, 20, 2, 1, "the slow API")
    assert client_api.patch(f"{URL}/lim", {"rate_limit": None}, format="json").json()["rate_limit"] is None
    assert _row("lim")["max_running"] == 5, "what a request does not name stays"
    assert heard.drain(2) == ["lim", "lim"]


@pytest.mark.parametrize("body, field", [
    ({"max_running": 0}, "max_running"),
    ({"max_running": -3}, "max_running"),
    ({"rate_limit": 0}, "rate_limit"),
    ({"rate_limit": "10"}, "rate_limit"),
    ({"max_running_per_key": 1.5}, "max_running_per_key"),
    ({"max_running": True}, "max_running"),
    ({"max_running": 2**31}, "max_running"),
    ({"rate_period_seconds": 0}, "rate_period_seconds"),
    ({"rate_period_seconds": 0.5}, "rate_period_seconds"),
    ({"rate_period_seconds": 86401}, "rate_period_seconds"),
    ({"description": "x" * 1001}, "description"),
    ({"description": "a\x00b"}, "description"),
    ({"paused": True}, "paused"),
    ({"max_runing": 3}, "max_runing"),
    ({"max_running": 3, "rate_limit": -1}, "rate_limit"),
])
def test_bad_settings_are_refused_naming_the_field_and_nothing_is_written(client_api, body, field):
    TaskFactory(queue="bad")
    before = _row("bad")
    assert_error(client_api.patch(f"{URL}/bad", body, format="json"), 400, "VALIDATION_ERROR", field)
    assert _row("bad") == before


@pytest.mark.django_db(transaction=True)
def test_pause_and_resume(client_api, listen):
    TaskFactory(queue="p")
    heard = listen("valka_queue_changed")
    body = client_api.post(f"{URL}/p/pause").json()
    assert body["paused"] is True and body["paused_until"] is None
    until = (timezone.now() + timedelta(minutes=5)).isoformat()
    body = client_api.post(f"{URL}/p/pause", {"until": until}, format="json").json()
    assert body["paused"] is True and body["paused_until"].startswith(until[:19])
    assert client_api.post(f"{URL}/p/resume").json()["paused"] is False
    assert _row("p")["paused"] is False and _row("p")["paused_until"] is None
    assert heard.drain(3) == ["p", "p", "p"]


def test_a_pause_whose_end_has_passed_is_over():
    TaskFactory(queue="ended")
    Queue.objects.filter(name="ended").update(paused=True, paused_until=db_now() - timedelta(seconds=1))
    from tasks import selectors

    view = selectors.queue_get(name="ended")
    assert view.paused is False and view.paused_until is None


@pytest.mark.parametrize("body, field", [
    ({"until": "2001-01-01T00:00:00Z"}, "until"),
    ({"until": "tomorrow"}, "until"),
    ({"until": "2031-01-01T00:00:00"}, "until"),
    ({"for": 5}, "for"),
])
def test_a_bad_pause_is_refused_naming_the_field_and_nothing_is_written(client_api, body, field):
    TaskFactory(queue="bp")
    assert_error(client_api.post(f"{URL}/bp/pause", body, format="json"), 400, "VALIDATION_ERROR", field)
    assert _row("bp")["paused"] is False


def test_the_service_refuses_a_pause_that_would_end_in_the_past():
    TaskFactory(queue="sp")
    with pytest.raises(ValidationError, match="until: must be in the future"):
        services.queue_pause(name="sp", until=timezone.now() - timedelta(seconds=1))
    assert _row("sp")["paused"] is False
    assert services.queue_pause(name="sp", until=timezone.now() + timedelta(minutes=1)).paused


def test_pause_resume_and_patch_of_an_unknown_queue_are_404(client_api):
    for call in (lambda: client_api.post(f"{URL}/ghost/pause"), lambda: client_api.post(f"{URL}/ghost/resume"),
                 lambda: client_api.patch(f"{URL}/ghost", {"max_running": 1}, format="json")):
        assert_error(call(), 404, "NOT_FOUND")
    assert not Queue.objects.exists()


def test_a_queue_only_a_worker_serves_can_be_paused(client_api):
    Worker.objects.create(id="w", queues=["served"], concurrency=1)
    assert client_api.post(f"{URL}/served/pause").json()["paused"] is True
