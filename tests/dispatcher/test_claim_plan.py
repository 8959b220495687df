"""The claim's plan right after a bulk insert, before any ANALYZE: the situation of every drain.

Reached through a join with its pick, the UPDATE was planned on statistics that said
"no PENDING rows" and rescanned the whole PENDING index once per picked row; it now reaches
the picked (locked) rows by their physical address, whatever the statistics say.
"""

import json

import pytest
from django.db import connection

from dispatcher import sql
from tasks.services import task_enqueue_many

pytestmark = pytest.mark.django_db(transaction=True)


def _plan(statement: str, params: dict, *, generic: bool) -> dict:
    """The executed plan: a custom one for these values, or the generic plan a prepared
    statement switches to after a few runs (the dispatcher prepares its statements)."""
    names = list(params)
    prepared = statement
    for i, name in enumerate(names, 1):
        prepared = prepared.replace(f"%({name})s", f"${i}")
    with connection.cursor() as cur:
        cur.execute(f"SET plan_cache_mode = {'force_generic_plan' if generic else 'force_custom_plan'}")
        cur.execute(f"PREPARE claim_plan AS {prepared}")
        try:
            placeholders = ", ".join(["%s"] * len(names))
            cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim_plan({placeholders})",
                        [params[n] for n in names])
            return cur.fetchone()[0][0]["Plan"]
        finally:
            cur.execute("DEALLOCATE claim_plan")
            cur.execute("RESET plan_cache_mode")


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_a_claim_after_a_bulk_insert_reads_only_the_picked_tasks(generic):
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE tasks SET (autovacuum_enabled = off)")  # keep the statistics stale
    try:
        for _ in range(3):
            task_enqueue_many([{"task_name": "t", "queue": "plan"}] * 1000)
        plan = _plan(sql.CLAIM, {"queue": "plan", "limit": 100, "node_id": "plan-test"}, generic=generic)
    finally:
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE tasks RESET (autovacuum_enabled)")
    assert plan["Actual Rows"] == 100
    nodes = list(_nodes(plan))
    updated = [n for n in nodes if n.get("Alias") == "tasks" and n["Node Type"] != "ModifyTable"]
    assert [n["Node Type"] for n in updated] == ["Tid Scan"], json.dumps(plan)[:2000]
    # The pick reads the PENDING index once, up to its limit; nothing rescans it.
    pick = [n for n in nodes if n.get("Index Name") == "tasks_dispatch_idx"]
    assert len(pick) == 1 and pick[0]["Actual Loops"] == 1 and pick[0]["Actual Rows"] == 100
