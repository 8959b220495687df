"""Inputs at the edges, through the REST API and the service layer: unicode, NUL bytes, invalid
Unicode, deep JSON, payloads at the size limit, far-away times and priorities at the int32 bounds.

A refused request answers 4xx in the API's error shape, names the offending field, and writes
nothing; an accepted one round-trips its values unchanged.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.db import connection

from dispatcher import sql as dispatcher_sql
from signals.models import Signal
from tasks import services
from tasks.errors import ValidationError
from tasks.models import Task
from tasks.specs import MAX_JSON_DEPTH
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/tasks"
MiB = 1024 * 1024
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

UNICODE = [
    "Grüße, Jürgen — naïve café",
    "日本語のタスク",
    "emoji 🚀🔥 and astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "right-to-left ‏עברית‎ العربية",
    "combining e\u0301 and zero\u200bwidth",
    "line\u2028separator and \u2029 paragraph",
    "tab\tnewline\nquote\"backslash\\",
]


def post(client, body):
    return client.post(URL, body, format="json")


def post_raw(client, text: str | bytes):
    return client.generic("POST", URL, text, content_type="application/json")


def assert_refused(response, status, field):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error", "message", "details"}, body
    assert field in body["details"] and field in body["message"], body


def nested(depth: int, leaf=1):
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# ---------------------------------------------------------------- unicode


@pytest.mark.parametrize("text", UNICODE)
def test_unicode_is_stored_and_returned_intact(client_api, text):
    r = post(client_api, {"task_name": text, "queue": "uni", "idempotency_key": text,
                          "input": {text: [text, {"k": text}]}, "metadata": {"note": text}})
    assert r.status_code == 201, r.content
    created = r.json()
    shown = client_api.get(f"{URL}/{created['id']}").json()
    for body in (created, shown):
        assert body["task_name"] == text and body["idempotency_key"] == text
        assert body["input"] == {text: [text, {"k": text}]} and body["metadata"] == {"note": text}
    row = Task.objects.get(id=created["id"])
    assert (row.task_name, row.idempotency_key, row.input, row.metadata["note"]) == (
        text, text, {text: [text, {"k": text}]}, text)
    listed = client_api.get(URL, {"task_name": text}).json()
    assert [t["id"] for t in listed["results"]] == [created["id"]]
    # The same key finds the same task.
    again = post(client_api, {"task_name": "other", "queue": "uni", "idempotency_key": text})
    assert again.status_code == 200 and again.json()["id"] == created["id"]


def test_escapes_that_only_look_like_nul_are_stored(client_api):
    text = "a literal \\u0000, \\\\u0000 and \\x00"
    r = post(client_api, {"task_name": text, "queue": "q", "input": {text: text}})
    assert r.status_code == 201, r.content
    assert Task.objects.get(id=r.json()["id"]).input == {text: text}


def test_unicode_signal_round_trips(client_api):
    task = TaskFactory(status="RUNNING")
    text = UNICODE[2]
    r = client_api.post(f"{URL}/{task.id}/signal", {"signal_type": text, "payload": {"ü": text}}, format="json")
    assert r.status_code == 201, r.content
    signal = Signal.objects.get(id=r.json()["id"])
    assert (signal.signal_type, signal.payload) == (text, {"ü": text})


def test_queue_names_outside_the_safe_charset_are_refused(client_api):
    for queue in ["日本", "a b", "x'; DROP TABLE tasks; --", "$$", "%s", "a\\b", "-leading", "a/b"]:
        assert_refused(post(client_api, {"task_name": "t", "queue": queue}), 400, "queue")
        assert_refused(post(client_api, {"task_name": "t", "queue_name": queue}), 400, "queue_name")
    assert Task.objects.count() == 0


# ---------------------------------------------------------------- NUL and invalid unicode


@pytest.mark.parametrize("body, field", [
    ({"task_name": "a\x00b", "queue": "q"}, "task_name"),
    ({"task_name": "t", "queue": "q\x00"}, "queue"),
    ({"task_name": "t", "queue": "q", "idempotency_key": "k\x00"}, "idempotency_key"),
    ({"task_name": "t", "queue": "q", "input": "a\x00b"}, "input"),
    ({"task_name": "t", "queue": "q", "input": {"deep": [{"x": "\x00"}]}}, "input"),
    ({"task_name": "t", "queue": "q", "input": {"key\x00": 1}}, "input"),
    ({"task_name": "t", "queue": "q", "metadata": {"m": "\x00"}}, "metadata"),
    ({"task_name": "t", "queue": "q", "concurrency_key": "k\x00"}, "concurrency_key"),
])
def test_nul_is_refused_naming_the_field(client_api, body, field):
    assert_refused(post(client_api, body), 400, field)
    assert Task.objects.count() == 0


def test_nul_in_a_signal_is_refused(client_api):
    task = TaskFactory(status="RUNNING")
    url = f"{URL}/{task.id}/signal"
    assert_refused(client_api.post(url, {"signal_type": "a\x00"}, format="json"), 400, "signal_type")
    assert_refused(client_api.post(url, {"signal_type": "a", "payload": ["\x00"]}, format="json"), 400, "payload")
    assert Signal.objects.count() == 0


@pytest.mark.parametrize("param", ["queue", "task_name", "status", "created_after"])
def test_nul_in_query_parameters_is_a_400(client_api, param):
    r = client_api.get(URL, {param: "x\x00y"})
    assert_refused(r, 400, param)
    r = client_api.get("/api/v1/dead-letters", {"queue": "\x00"})
    assert_refused(r, 400, "queue")


@pytest.mark.parametrize("field", ["task_name", "idempotency_key", "input", "metadata"])
def test_lone_surrogates_are_refused(client_api, field):
    # Valid JSON (a \u escape) that decodes to a string UTF-8 cannot encode.
    body = {"task_name": "t", "queue": "q"}
    body[field] = {"k": "__S__"} if field == "metadata" else "__S__"
    r = post_raw(client_api, json.dumps(body).replace("__S__", "\\ud800"))
    assert_refused(r, 400, field)
    assert Task.objects.count() == 0


def test_invalid_utf8_is_400(client_api):
    r = post_raw(client_api, b'{"task_name": "\xff\xfe", "queue": "q"}')
    assert_refused(r, 400, "body")
    assert Task.objects.count() == 0


# ---------------------------------------------------------------- deep JSON


def test_body_nested_ten_thousand_levels_is_400_not_500(client_api):
    deep = "[" * 10_000 + "]" * 10_000
    r = post_raw(client_api, '{"task_name": "t", "queue": "q", "input": ' + deep + "}")
    assert_refused(r, 400, "body")
    assert "nested too deeply" in r.json()["message"]
    r = client_api.post(f"{URL}/{TaskFactory(status='RUNNING').id}/signal",
                        '{"signal_type": "s", "payload": ' + deep + "}", content_type="application/json")
    assert_refused(r, 400, "body")
    assert Task.objects.filter(queue="q").count() == 0 and Signal.objects.count() == 0


def test_json_nesting_limit_is_exact(client_api):
    ok = post(client_api, {"task_name": "t", "queue": "q", "input": nested(MAX_JSON_DEPTH)})
    assert ok.status_code == 201, ok.content
    assert client_api.get(f"{URL}/{ok.json()['id']}").json()["input"] == nested(MAX_JSON_DEPTH)
    for field, value in [("input", nested(MAX_JSON_DEPTH + 1)), ("metadata", {"m": nested(MAX_JSON_DEPTH)})]:
        r = post(client_api, {"task_name": "t", "queue": "q", field: value})
        assert_refused(r, 400, field)
        assert "nested too deeply" in r.json()["message"]
    assert Task.objects.count() == 1


def test_python_callers_get_the_same_depth_check():
    with pytest.raises(ValidationError) as err:
        services.task_enqueue(task_name="t", queue="q", input=nested(5000))
    assert "input" in err.value.details
    assert Task.objects.count() == 0


# ---------------------------------------------------------------- sizes


def test_payloads_up_to_one_mebibyte_each_are_accepted(client_api):
    big = "x" * (MiB - 2)  # the JSON encoding adds the quotes
    meta = {"m": "y" * (MiB - 9)}  # {"m": "..."} adds 9 bytes
    assert len(json.dumps(meta, ensure_ascii=False, separators=(", ", ": "))) == MiB
    r = post(client_api, {"task_name": "t", "queue": "q", "input": big, "metadata": meta})
    assert r.status_code == 201, r.content[:200]
    row = Task.objects.get(id=r.json()["id"])
    assert row.input == big and row.metadata == meta


def test_one_byte_over_is_413_naming_the_field(client_api):
    r = post(client_api, {"task_name": "t", "queue": "q", "metadata": {"m": "y" * (MiB - 8)}})
    assert_refused(r, 413, "metadata")
    assert r.json()["error"] == "PAYLOAD_TOO_LARGE"
    # Multi-byte characters count as their UTF-8 bytes: 2 bytes each.
    r = post(client_api, {"task_name": "t", "queue": "q", "input": "é" * (MiB // 2)})
    assert_refused(r, 413, "input")
    assert Task.objects.count() == 0


def test_a_body_over_the_request_limit_is_413(client_api, settings):
    r = post_raw(client_api, '{"task_name": "t", "queue": "q", "input": "' + "x" * (3 * MiB) + '"}')
    assert_refused(r, 413, "body")
    assert r.json()["error"] == "PAYLOAD_TOO_LARGE"
    assert Task.objects.count() == 0


def test_signal_payload_limit(client_api):
    task = TaskFactory(status="RUNNING")
    url = f"{URL}/{task.id}/signal"
    limit = 64 * 1024
    ok = client_api.post(url, {"signal_type": "s", "payload": "p" * (limit - 2)}, format="json")
    assert ok.status_code == 201, ok.content[:200]
    r = client_api.post(url, {"signal_type": "s", "payload": "p" * (limit - 1)}, format="json")
    assert_refused(r, 413, "payload")
    assert Signal.objects.count() == 1


# ---------------------------------------------------------------- times


def _claim(queue: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(dispatcher_sql.CLAIM, dispatcher_sql.claim_params(queue=queue, limit=10, node_id="edge-test"))
        return [str(row[0]) for row in cursor.fetchall()]


def test_run_at_far_in_the_past_and_future(client_api):
    past = post(client_api, {"task_name": "t", "queue": "times", "run_at": "0001-01-01T00:00:00Z"})
    future = post(client_api, {"task_name": "t", "queue": "times", "scheduled_at": "9999-12-31T23:59:59.999999Z"})
    assert past.status_code == future.status_code == 201, (past.content, future.content)
    assert past.json()["run_at"].startswith("0001-01-01T00:00:00")
    assert future.json()["run_at"].startswith("9999-12-31T23:59:59.999999")
    assert Task.objects.get(id=past.json()["id"]).run_at == datetime(1, 1, 1, tzinfo=UTC)
    # The one in year 1 is due now and claimed; the one in 9999 is not.
    assert _claim("times") == [past.json()["id"]]
    # Both list and show without trouble.
    assert client_api.get(URL, {"queue": "times"}).json()["count"] == 2
    assert client_api.get(f"{URL}/{future.json()['id']}").status_code == 200


@pytest.mark.parametrize("value", [
    "0001-01-01T00:00:00+01:00",  # year 0 in UTC
    "9999-12-31T23:59:59-00:01",  # year 10000 in UTC
    "0000-01-01T00:00:00Z",
    "10000-01-01T00:00:00Z",
    "2030-01-01T00:00:00",  # no time zone
    "2030-02-30T00:00:00Z",
    "tomorrow",
    "",
])
def test_times_outside_what_can_be_stored_are_refused(client_api, value):
    assert_refused(post(client_api, {"task_name": "t", "queue": "q", "run_at": value}), 400, "run_at")
    assert Task.objects.count() == 0


def test_offsets_postgresql_would_refuse_are_stored_as_utc(client_api):
    r = post(client_api, {"task_name": "t", "queue": "q", "run_at": "2030-06-01t12:00:00+20:30"})
    assert r.status_code == 201, r.content
    assert Task.objects.get(id=r.json()["id"]).run_at == datetime(2030, 5, 31, 15, 30, tzinfo=UTC)
    assert client_api.get(URL, {"created_before": "2999-01-01T00:00:00+23:59"}).json()["count"] == 1


# ---------------------------------------------------------------- priorities


def test_priority_at_the_int32_bounds(client_api):
    low = post(client_api, {"task_name": "low", "queue": "prio", "priority": INT32_MIN})
    high = post(client_api, {"task_name": "high", "queue": "prio", "priority": INT32_MAX})
    assert low.status_code == high.status_code == 201
    assert (low.json()["priority"], high.json()["priority"]) == (INT32_MIN, INT32_MAX)
    assert _claim("prio") == [high.json()["id"], low.json()["id"]]


@pytest.mark.parametrize("priority", [INT32_MIN - 1, INT32_MAX + 1, 2**63, -(2**100), 1.5, "1", True, None])
def test_priority_beyond_the_bounds_is_refused(client_api, priority):
    r = post(client_api, {"task_name": "t", "queue": "q", "priority": priority})
    if priority is None:
        assert r.status_code == 201 and r.json()["priority"] == 0  # null means the default
        return
    assert_refused(r, 400, "priority")
    assert Task.objects.count() == 0


@pytest.mark.parametrize("param, value", [("limit", "99999999999999999999999"), ("offset", "1" + "0" * 30),
                                          ("offset", str(2**31)), ("limit", "0"), ("offset", "-1"),
                                          ("limit", "abc"), ("offset", "1e3"), ("limit", "١٢")])
def test_limit_and_offset_out_of_range_are_400(client_api, param, value):
    for url in (URL, "/api/v1/dead-letters", "/api/v1/workers"):
        assert_refused(client_api.get(url, {param: value}), 400, param)


def test_non_uuid_ids_are_404(client_api):
    for bad in ["not-a-uuid", "1" * 500, "%00", "'; DROP TABLE tasks; --", "日本"]:
        for url in (f"{URL}/{bad}", f"{URL}/{bad}/runs", f"/api/v1/dead-letters/{bad}", f"/api/v1/signals/{bad}"):
            r = client_api.get(url)
            assert r.status_code == 404, (url, r.content)
            assert r.json()["error"] == "NOT_FOUND"
