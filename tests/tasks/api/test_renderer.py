"""The API's renderer writes what DRF's JSON renderer writes, faster."""

import datetime
import decimal
import json
import uuid

import pytest
from django.utils.translation import gettext_lazy
from rest_framework.exceptions import ErrorDetail
from rest_framework.renderers import JSONRenderer

from tasks.api.renderers import ValkaJSONRenderer
from tasks.states import TaskStatus

SAME_BYTES = [
    {"a": 1, "b": [1.5, None, True, False, "é 漢 😀", 'q"\\\n\t'], "c": {"d": {}}, "e": []},
    {"at": datetime.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=datetime.UTC),
     "offset": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
     "day": datetime.date(2026, 1, 2), "id": uuid.UUID("0197c5a2-5b1e-7000-8000-000000000001")},
    {"decimal": decimal.Decimal("1.25"), "lazy": gettext_lazy("text"), "status": TaskStatus.PENDING,
     "error": ErrorDetail("bad", code="invalid")},
    {"separators": "a\u2028b\u2029c"},
    {"big": 2**70, "small": -(2**63)},
    {1: "a key that is not a string"},
    [],
]


@pytest.mark.parametrize("data", SAME_BYTES)
def test_same_bytes_as_drf(data):
    assert ValkaJSONRenderer().render(data) == JSONRenderer().render(data)


def test_floats_are_the_same_numbers():
    data = [1e16, 0.1, -0.0, 1e-7, 123456.789, 2.5e-300]
    assert json.loads(ValkaJSONRenderer().render(data)) == json.loads(JSONRenderer().render(data)) == data


def test_indented_output_and_nothing_are_drfs():
    data = {"a": [1, 2]}
    assert ValkaJSONRenderer().render(data, "application/json; indent=2") == b'{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert ValkaJSONRenderer().render(None) == b""


def test_drf_settings_other_than_the_defaults_are_drfs():
    data = {"text": "é 漢", "list": [1, 2.5]}
    for name, value in (("ensure_ascii", True), ("compact", False)):
        ours, drfs = ValkaJSONRenderer(), JSONRenderer()
        setattr(ours, name, value)
        setattr(drfs, name, value)
        assert ours.render(data) == drfs.render(data), name


def test_what_json_cannot_hold_is_refused_as_drf_refuses_it():
    for data in ({"s": "\ud800"}, {"o": object()}):
        with pytest.raises((TypeError, UnicodeEncodeError)):
            JSONRenderer().render(data)
        with pytest.raises((TypeError, UnicodeEncodeError)):
            ValkaJSONRenderer().render(data)


@pytest.mark.django_db
def test_the_api_answers_with_it(client_api):
    r = client_api.get("/api/v1/tasks", HTTP_ACCEPT="application/json; indent=4")
    assert r.status_code == 200 and r.content.startswith(b"{\n    ")
    assert isinstance(r.accepted_renderer, ValkaJSONRenderer)
    r = client_api.post("/api/v1/tasks", {"task_name": "t\u2028", "queue": "q"}, format="json")
    assert r.status_code == 201 and b"t\\u2028" in r.content
    assert r.json()["task_name"] == "t\u2028"
