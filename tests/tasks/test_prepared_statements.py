"""The producer's hot statements are prepared once per connection; the ORM's stay unprepared;
`VALKA_DB_PREPARED_STATEMENTS=false` prepares nothing (for poolers that cannot keep them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg
import pytest
from django.db import connection

from tasks import services
from tasks.models import Task
from tests.helpers import ROOT

pytestmark = pytest.mark.django_db


def prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_one_task_insert_and_the_key_look_up_are_prepared_and_orm_queries_are_not(client_api):
    for i in range(6):  # more often than psycopg's own threshold (5) would let pass unprepared
        services.task_enqueue(task_name="t", queue="prepared", input=i)
        assert Task.objects.filter(queue="prepared").count() == i + 1
        # Django binds the ORM's parameters client side, which never prepares; a statement bound
        # server side that does not ask to be prepared is not prepared either, however often it runs.
        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute('SELECT count(*) FROM "tasks" WHERE queue = %s', ["prepared"])
    statements = prepared()
    # Prepared once, reused (the batch INSERT, which an earlier test on this connection may have
    # prepared, is told apart by its jsonb_to_recordset): the one that looks for an offered slot,
    # and the one that does not, taken just after a miss (tasks/offer_misses.py).
    singles = [s for s in statements if "INSERT INTO tasks" in s and "jsonb_to_recordset" not in s]
    assert sum("queue_offers" in s for s in singles) == 1 and sum("queue_offers" not in s for s in singles) <= 1
    assert not any('"tasks"' in s for s in statements)  # the counts: not prepared
    assert client_api.get("/api/v1/tasks").status_code == 200
    assert sum("key_hash" in s for s in prepared()) == 1


def test_with_prepared_statements_off_the_insert_runs_unprepared():
    connection.ensure_connection()
    pg = connection.connection
    threshold, pg.prepare_threshold = pg.prepare_threshold, None  # what the setting turned off gives
    try:
        task = services.task_enqueue(task_name="t", queue="unprepared", input={"a": 1})
        assert Task.objects.get(id=task.id).input == {"a": 1}
        assert not any("INSERT INTO tasks" in s for s in prepared())
    finally:
        pg.prepare_threshold = threshold


@pytest.mark.parametrize("value, threshold", [(None, 2**31 - 1), ("false", None)])
def test_the_setting(value, threshold):
    env = {k: v for k, v in os.environ.items() if k != "VALKA_DB_PREPARED_STATEMENTS"}
    if value is not None:
        env["VALKA_DB_PREPARED_STATEMENTS"] = value
    code = ("import json, django; django.setup(); from django.conf import settings; "
            "print(json.dumps(settings.DATABASES['default']['OPTIONS'].get('prepare_threshold')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**env, "DJANGO_SETTINGS_MODULE": "valka.settings"}, check=True)
    assert json.loads(out.stdout) == threshold
