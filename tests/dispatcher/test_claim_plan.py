"""The claim's plan right after a burst of inserts, before any ANALYZE: the start of every drain.

The statistics then say "(almost) no PENDING rows". Planned on them, the claim once joined
its pick on id and rescanned the whole PENDING index per picked row, and fetched every
PENDING task of the queue to sort them. It must read an index in claim order up to its
limit, and reach each picked row by its address, in the custom plan and in the generic
plan a prepared statement switches to.
"""

import json

import pytest
from django.db import connection

from dispatcher import sql
from tasks.services import task_enqueue_many

pytestmark = pytest.mark.django_db(transaction=True)


def _plan(statement: str, params: dict, *, generic: bool) -> dict:
    """The executed plan, on a session set up like the dispatcher's claim connections."""
    names = list(params)
    prepared = statement
    for i, name in enumerate(names, 1):
        prepared = prepared.replace(f"%({name})s", f"${i}")
    with connection.cursor() as cur:
        cur.execute(sql.CLAIM_SESSION)
        cur.execute(f"SET plan_cache_mode = {'force_generic_plan' if generic else 'force_custom_plan'}")
        cur.execute(f"PREPARE claim_plan AS {prepared}")
        try:
            placeholders = ", ".join(["%s"] * len(names))
            cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim_plan({placeholders})",
                        [params[n] for n in names])
            return cur.fetchone()[0][0]["Plan"]
        finally:
            cur.execute("DEALLOCATE claim_plan")
            cur.execute("RESET ALL")


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


@pytest.fixture
def stale_statistics():
    """A table analyzed when the queue held a handful of PENDING tasks, then a burst of them."""
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE tasks SET (autovacuum_enabled = off)")
    try:
        for _ in range(4):
            task_enqueue_many([{"task_name": "t", "queue": "plan"}] * 1000)
        with connection.cursor() as cur:
            cur.execute("UPDATE tasks SET status = 'COMPLETED', finished_at = now() "
                        "WHERE id NOT IN (SELECT id FROM tasks ORDER BY id LIMIT 20)")
            cur.execute("ANALYZE tasks")
        for _ in range(10):
            task_enqueue_many([{"task_name": "t", "queue": "plan"}] * 1000)
        yield
    finally:
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE tasks RESET (autovacuum_enabled)")


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_a_claim_after_a_burst_reads_only_what_it_claims(stale_statistics, generic):
    plan = _plan(sql.CLAIM, {"queue": "plan", "limit": 100, "node_id": "plan-test"}, generic=generic)
    assert plan["Actual Rows"] == 100
    nodes = list(_nodes(plan))
    shown = json.dumps(plan)[:3000]
    assert not [n for n in nodes if n["Node Type"] == "Sort"], shown
    # The pick walks an index once, in claim order, and stops at the limit.
    pick = [n for n in nodes if n.get("Relation Name") == "tasks" and n.get("Alias") != "tasks"]
    assert [(n["Node Type"], n["Actual Loops"], n["Actual Rows"]) for n in pick] == [("Index Scan", 1, 100)], shown
    assert pick[0]["Index Name"] in ("tasks_dispatch_idx", "tasks_queue_status_idx"), shown
    # The UPDATE reaches each picked row by its address.
    updated = [n for n in nodes if n.get("Alias") == "tasks" and n["Node Type"] != "ModifyTable"]
    assert [n["Node Type"] for n in updated] == ["Tid Scan"], shown
