"""The plan of the firing's batch read (schedules/sql.py DUE_SCHEDULES) while the statistics of
schedules are stale: the templates are built for the batch, whichever way the rows are found."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction

from schedules import sql
from tests.plans import no_autovacuum, nodes, outline

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = datetime(2020, 1, 1, 10, 0, tzinfo=UTC)
DUE, BATCH = 2_000, 100


def test_a_batch_builds_the_templates_of_its_own_schedules_only():
    """2,000 schedules added at once, all due, read a batch of 100 at a time before any ANALYZE: the
    planner, promised few rows, may sort every due schedule to find the earliest; the JSON of each
    task's template is made only for the 100 the batch locks (it once was for all 2,000, in the
    scan under the sort, which made a burst of due schedules several times slower to fire)."""
    with no_autovacuum("schedules"):
        with connection.cursor() as cur:
            cur.execute("""
                INSERT INTO schedules (name, cron, timezone, catch_up, enabled, declared, task_name, queue, input,
                                       metadata, priority, max_retries, timeout_seconds, next_run_at, fired_count)
                SELECT 'due-' || g, '* * * * *', 'UTC', 'latest', true, false, 'noop', 'q', '{}', '{}', 0, 3, 300,
                       %s, 0
                FROM generate_series(1, %s) g""", [SLOT, DUE])
        with transaction.atomic(), connection.cursor() as cur:  # the batch's locks go with the rollback
            cur.execute(f"EXPLAIN (ANALYZE, VERBOSE, FORMAT JSON) {sql.DUE_SCHEDULES}", {"now": SLOT, "limit": BATCH})
            plan = cur.fetchone()[0][0]["Plan"]
            transaction.set_rollback(True)
    shown = outline(plan)
    assert plan["Actual Rows"] == BATCH, shown
    building = [n for n in nodes(plan) if "json_build_object" in json.dumps(n.get("Output", []))]
    assert building, shown
    assert all(n["Actual Rows"] * n["Actual Loops"] <= BATCH for n in building), \
        "\n".join(f"{n['Node Type']} {n['Actual Rows']} rows: {n['Output']}" for n in building) + "\n" + shown
