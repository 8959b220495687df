"""The REST API fuzzed from its own OpenAPI schema with schemathesis, in process.

Every generated request must get a documented answer (no 500, no undocumented
status, bodies that match the schema); every 4xx must carry the API's error
shape; and a rejected request must not have written a row.
"""

from __future__ import annotations

import json

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from django.db import connection
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from tasks.api.auth import hash_key
from tasks.models import ApiKey

# The key the fuzzer authenticates with; the fixture stores its hash.
KEY = "vk_fuzz-" + "k" * 40
TABLES = ("tasks", "signals", "dead_letter_queue", "task_runs", "schedules", "queues")


def _row_counts() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t}" for t in TABLES))
        return dict(cursor.fetchall())


@pytest.fixture
def fuzz_key(transactional_db):
    ApiKey.objects.create(name="fuzz", prefix=KEY[:10], key_hash=hash_key(KEY))


# Loading the schema needs no database: it is generated from the code.
CONFIG = SchemathesisConfig.from_dict({"auth": {"openapi": {"ApiKey": {"bearer": KEY}}}})
schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application(), config=CONFIG).include(
    path_regex=r"^/api/v1/")


@schema.parametrize()
@settings(max_examples=30, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_api_answers_every_request_as_documented(case, fuzz_key):
    before = _row_counts()
    excluded = []
    if case.operation.label == "POST /api/v1/tasks/batch/":
        # Items are validated one by one and answered in the 200/201 body, so a batch holding an
        # invalid item is not refused as a whole.
        excluded.append(negative_data_rejection)
    if case.operation.label in ("POST /api/v1/schedules/", "PATCH /api/v1/schedules/{name}/"):
        # Whether a cron expression or a time zone name is valid is beyond JSON Schema: a string the
        # schema allows may be refused with a 400 naming `cron` or `timezone`.
        excluded.append(positive_data_acceptance)
    if (case.query or {}).get("cursor"):
        # A cursor is opaque (tasks.api.pagination): only one the server issued is valid, which no
        # schema can describe; any other string is refused with a 400 naming `cursor`.
        excluded.append(positive_data_acceptance)
    pause = case.operation.label == "POST /api/v1/queues/{id}/pause/"
    if pause and isinstance(case.body, dict) and case.body.get("until"):
        # A pause's end must be in the future (else a 400 naming `until`): no schema can say "after now".
        excluded.append(positive_data_acceptance)
    if "\\u0000" in json.dumps(case.body if isinstance(case.body, dict | list) else None):
        # A NUL inside the free JSON of `input` or `metadata` is refused (PostgreSQL cannot store it):
        # the schema says so in words, as JSON Schema cannot reach into free JSON.
        excluded.append(positive_data_acceptance)
    response = case.call_and_validate(excluded_checks=excluded)
    if 400 <= response.status_code < 500:
        body = response.json()
        assert set(body) == {"error", "message", "details"}, body
        assert isinstance(body["details"], dict) and body["error"] and body["message"]
        assert _row_counts() == before, f"a rejected request ({response.status_code}) wrote rows"
