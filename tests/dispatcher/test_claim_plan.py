"""The claim's plan right after a burst of inserts, before any ANALYZE: the start of every drain.

The statistics then say "(almost) no PENDING rows". Planned on them, the claim once joined
its pick on id and rescanned the whole PENDING index per picked row, and fetched every
PENDING task of the queue to sort them. It must read an index in claim order up to its
limit, and reach each picked row by its address, in the custom plan and in the generic
plan a prepared statement switches to.
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from dispatcher import sql
from tasks.models import Task
from tasks.services import task_enqueue_many
from tests.plans import executed_plan, no_autovacuum, nodes, outline

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def stale_statistics():
    """A table analyzed when the queue held a handful of PENDING tasks, then a burst of them."""
    with no_autovacuum("tasks"):
        for _ in range(4):
            task_enqueue_many([{"task_name": "t", "queue": "plan"}] * 1000)
        with connection.cursor() as cur:
            cur.execute("UPDATE tasks SET status = 'COMPLETED', finished_at = now() "
                        "WHERE id NOT IN (SELECT id FROM tasks ORDER BY id LIMIT 20)")
            cur.execute("ANALYZE tasks")
        for _ in range(10):
            task_enqueue_many([{"task_name": "t", "queue": "plan"}] * 1000)
        yield


def _sorted(sort: dict) -> dict:
    """What a sort reads, seen through a gate (a Result with a one-time filter: the claim's
    durability setting for its transaction, evaluated once), which passes every row on as it is."""
    [child] = [c for c in sort["Plans"] if c["Parent Relationship"] == "Outer"]
    if child["Node Type"] == "Result" and "One-Time Filter" in child:
        [child] = [c for c in child["Plans"] if c["Parent Relationship"] == "Outer"]
    return child


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_a_claim_after_a_burst_reads_only_what_it_claims(stale_statistics, generic):
    plan = executed_plan(sql.CLAIM, sql.claim_params(queue="plan", limit=100, node_id="plan-test"),
                         generic=generic, session=sql.CLAIM_SESSION)
    assert plan["Actual Rows"] == 100
    all_nodes = list(nodes(plan))
    shown = outline(plan)
    # The only sorts are of the claimed rows, into claim order, and of the queue's few priorities.
    sorts = [n for n in all_nodes if n["Node Type"] == "Sort"]
    assert all(_sorted(n).get("CTE Name") in ("claimed", "priorities") for n in sorts), shown
    # Each read of tasks is an index scan run once (the pick stops at its limit), except the
    # UPDATE, which reaches each picked row by its address.
    reads = [n for n in all_nodes if n.get("Relation Name") == "tasks" and n["Node Type"] != "ModifyTable"]
    assert {n["Node Type"] for n in reads} <= {"Index Scan", "Index Only Scan", "Tid Scan"}, shown
    assert all(n["Actual Loops"] == 1 for n in reads if n["Node Type"] != "Tid Scan"), shown
    update = next(n for n in all_nodes if n["Node Type"] == "ModifyTable")
    assert [c["Node Type"] for c in update["Plans"] if c.get("Relation Name") == "tasks"] == ["Tid Scan"], shown


def test_tasks_scheduled_for_later_are_not_read_by_a_claim():
    """Many tasks due later, one due now: the claim reads the due one, not the others."""
    later = (timezone.now() + timedelta(hours=2)).isoformat()
    for _ in range(5):
        task_enqueue_many([{"task_name": "t", "queue": "plan", "run_at": later}] * 1000)
    due = task_enqueue_many([{"task_name": "t", "queue": "plan"}])[0]
    with connection.cursor() as cur:
        cur.execute("ANALYZE tasks")
    plan = executed_plan(sql.CLAIM, sql.claim_params(queue="plan", limit=64, node_id="plan-test"),
                         generic=False, session=sql.CLAIM_SESSION)
    assert plan["Actual Rows"] == 1
    pick = [n for n in nodes(plan) if n.get("Relation Name") == "tasks" and "Index" in n["Node Type"]]
    # A few index entries per probe, never the five thousand scheduled ones.
    assert all(n["Actual Rows"] <= 2 for n in pick), outline(plan)
    assert Task.objects.get(id=due.id).status == "DISPATCHING"


def test_a_claim_takes_the_highest_priority_first_then_the_earliest_due():
    low = task_enqueue_many([{"task_name": "t", "queue": "order", "priority": 0}] * 3)
    high = task_enqueue_many([{"task_name": "t", "queue": "order", "priority": 5}] * 3)
    mid = task_enqueue_many([{"task_name": "t", "queue": "order", "priority": 2}] * 3)
    with connection.cursor() as cur:
        cur.execute(sql.CLAIM, sql.claim_params(queue="order", limit=7, node_id="order-test"))
        claimed = {row[0] for row in cur.fetchall()}
    assert claimed == {str(t.id) for t in high + mid + low[:1]}


def test_the_priority_probes_skip_the_tasks_claimed_before(stale_statistics):
    """Claimed tasks leave their PENDING index entries behind until a vacuum, at the head of the
    claim range. Each priority is found from the newest end of the range, not by walking them."""
    with connection.cursor() as cur:
        cur.execute(sql.CLAIM_SESSION)
        for _ in range(30):  # 9,000 of the queue's 10,000 PENDING tasks claimed, a batch at a time
            cur.execute(sql.CLAIM, sql.claim_params(queue="plan", limit=300, node_id="plan-test"))
        cur.execute("RESET ALL")
    plan = executed_plan(sql.CLAIM, sql.claim_params(queue="plan", limit=10, node_id="plan-test"),
                         generic=True, session=sql.CLAIM_SESSION)
    assert plan["Actual Rows"] == 10
    probes = [n for n in nodes(plan) if n["Node Type"] == "Index Only Scan"]
    assert probes and all(n["Shared Hit Blocks"] <= 8 for n in probes), outline(plan)


def test_a_claim_after_a_floor_skips_the_tasks_claimed_before_it(stale_statistics):
    """During a backlog the dispatcher starts each claim after the last task it claimed."""
    with connection.cursor() as cur:
        cur.execute(sql.CLAIM_SESSION)
        after = None
        for _ in range(30):  # 9,000 tasks claimed, each claim after the last one's floor
            cur.execute(sql.CLAIM, sql.claim_params(queue="plan", limit=300, node_id="plan-test", after=after))
            last = cur.fetchall()[-1]
            after = (last[7], last[8], last[0])  # priority, run_at, id of the last task claimed
        cur.execute("RESET ALL")
    plan = executed_plan(sql.CLAIM, sql.claim_params(queue="plan", limit=10, node_id="plan-test", after=after),
                         generic=True, session=sql.CLAIM_SESSION)
    assert plan["Actual Rows"] == 10
    due = [n for n in nodes(plan) if n["Node Type"] == "Index Scan"]
    assert due and all(n["Shared Hit Blocks"] <= 12 for n in due), outline(plan)
