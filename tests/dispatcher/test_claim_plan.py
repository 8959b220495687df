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
from tasks.models import Queue, Task
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


def _task_reads(plan: dict) -> list[dict]:
    return [n for n in nodes(plan) if n.get("Relation Name") == "tasks" and n["Node Type"] != "ModifyTable"]


def _rows_read(plan: dict) -> int:
    """Rows the plan's index reads of tasks went through, those a filter threw away included."""
    return sum((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
               for n in _task_reads(plan) if n["Node Type"] != "Tid Scan")


def _tasks_update_reads(plan: dict) -> list[str]:
    """How the UPDATE of tasks reaches its rows: ["Tid Scan"] when by their address."""
    update = next(n for n in nodes(plan) if n["Node Type"] == "ModifyTable" and n["Relation Name"] == "tasks")
    return [c["Node Type"] for c in update["Plans"] if c.get("Relation Name") == "tasks"]


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
    reads = _task_reads(plan)
    assert {n["Node Type"] for n in reads} <= {"Index Scan", "Index Only Scan", "Tid Scan"}, shown
    assert all(n["Actual Loops"] == 1 for n in reads if n["Node Type"] != "Tid Scan"), shown
    assert _tasks_update_reads(plan) == ["Tid Scan"], shown


def _drained_then_burst() -> None:
    """A queue drained (every task finished), then a burst of PENDING tasks, fifty of them
    started since."""
    for _ in range(4):
        task_enqueue_many([{"task_name": "t", "queue": "plan"}] * 1000)
    with connection.cursor() as cur:
        cur.execute("UPDATE tasks SET status = 'COMPLETED', finished_at = now()")
    for _ in range(10):
        task_enqueue_many([{"task_name": "t", "queue": "plan"}] * 1000)
    with connection.cursor() as cur:
        cur.execute("UPDATE tasks SET status = 'RUNNING' WHERE id IN "
                    "(SELECT id FROM tasks WHERE status = 'PENDING' ORDER BY id LIMIT 50)")


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_a_claim_planned_on_an_empty_table_reaches_what_it_claims_by_address(generic):
    """The claim connections plan CLAIM at their first claim, often on an empty table."""
    with no_autovacuum("tasks"):
        plan = executed_plan(sql.CLAIM, sql.claim_params(queue="plan", limit=100, node_id="plan-test"),
                             generic=generic, session=sql.CLAIM_SESSION, planned_before=_drained_then_burst)
    shown = outline(plan)
    assert plan["Actual Rows"] == 100, shown
    assert _tasks_update_reads(plan) == ["Tid Scan"], shown


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


# ---------------------------------------------------------------- queues with controls

def _limited_plan(queue: str, limit: int, *, generic: bool) -> dict:
    return executed_plan(sql.CLAIM_LIMITED, {"queue": queue, "limit": limit, "node_id": "plan-test"},
                         generic=generic, session=sql.CLAIM_SESSION)


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_a_limited_claim_after_a_burst_reads_only_what_it_claims(stale_statistics, generic):
    Queue.objects.filter(name="plan").update(max_running=5000, rate_limit=10_000)
    plan = _limited_plan("plan", 100, generic=generic)
    shown = outline(plan)
    assert plan["Actual Rows"] == 101, shown  # the tasks and the answer
    reads = _task_reads(plan)
    assert {n["Node Type"] for n in reads} <= {"Index Scan", "Index Only Scan", "Tid Scan"}, shown
    # The pick reads one task more than it claims; nothing is DISPATCHING or RUNNING yet, and the
    # queue's 3,980 finished tasks are not read to count the running ones (nor filtered out).
    assert _rows_read(plan) <= 101 + 4, shown
    assert _tasks_update_reads(plan) == ["Tid Scan"], shown


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_a_limited_claim_planned_on_an_empty_table_reads_no_finished_task_and_no_pending_one(generic):
    """A dispatcher's claim connection plans its limited claim once, at its first claim, often on
    an empty table; every later claim runs that plan, after thousands of tasks have finished."""
    Queue.objects.create(name="plan", max_running=5000)
    with no_autovacuum("tasks"):
        plan = executed_plan(sql.CLAIM_LIMITED, {"queue": "plan", "limit": 100, "node_id": "plan-test"},
                             generic=generic, session=sql.CLAIM_SESSION, planned_before=_drained_then_burst)
    shown = outline(plan)
    assert plan["Actual Rows"] == 101, shown
    # The running tasks are counted (50), the pick reads one task more than it claims (101), a few
    # probes find the priorities: the 4,000 finished tasks are not read, even to be filtered out.
    assert _rows_read(plan) <= 50 + 101 + 4, shown
    # The claimed tasks are reached by their address, not by a walk of every PENDING entry.
    assert _tasks_update_reads(plan) == ["Tid Scan"], shown


@pytest.fixture
def one_big_key():
    """100,000 PENDING tasks of one key, and one task of each of nine others, in a queue with a
    limit per key; the statistics taken before the flood."""
    with no_autovacuum("tasks"):
        small = task_enqueue_many([{"task_name": "t", "queue": "keys", "concurrency_key": f"small-{i}"}
                                   for i in range(9)])
        with connection.cursor() as cur:
            cur.execute("ANALYZE tasks")
            cur.execute("INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count,"
                        " timeout_seconds, input, metadata, run_at, created_at, updated_at, concurrency_key)"
                        " SELECT valka_uuid7(), 't', 'keys', 'PENDING', 0, 3, 0, 300, NULL, '{}', now(), now(),"
                        " now(), 'big' FROM generate_series(1, 100000)")
        Queue.objects.filter(name="keys").update(max_running_per_key=50)
        yield small


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_a_fair_claim_reads_a_few_tasks_per_key_not_the_big_key_s_backlog(one_big_key, generic):
    plan = _limited_plan("keys", 20, generic=generic)
    shown = outline(plan)
    # An equal share of the twenty for each of the ten keys: the small ones have one task each.
    assert plan["Actual Rows"] == 12, shown
    reads = _task_reads(plan)
    assert "Seq Scan" not in {n["Node Type"] for n in nodes(plan)}, shown
    # Ten keys found one probe each; each key's running tasks and its share of due tasks; the
    # look for tasks without a key among the first due ones (20 + 16): under a hundred rows.
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in reads if n["Node Type"] != "Tid Scan") <= 100, shown
    claimed = Task.objects.filter(queue="keys", status="DISPATCHING")
    assert set(claimed.exclude(concurrency_key="big").values_list("id", flat=True)) == {t.id for t in one_big_key}
    assert claimed.filter(concurrency_key="big").count() == 2


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_the_fair_claim_finds_each_key_with_one_probe(one_big_key, generic):
    """The walk of the keys reads each next key once: a key computed in a subquery and named twice
    (kept, and compared with the first) was once computed twice, a probe more per key visited."""
    plan = _limited_plan("keys", 20, generic=generic)
    walk = [n for n in _task_reads(plan)
            if n["Node Type"] == "Index Only Scan" and n["Index Name"] == "tasks_key_pending_idx"]
    # Ten keys: the first (a probe past the turn's cursor, and one from the start when that finds
    # none), one probe from each key to the next, and the wrap from the start after the last:
    # 13 (26 with the key computed twice).
    assert sum(n["Actual Loops"] for n in walk) <= 10 + 3, outline(plan)


@pytest.mark.parametrize("session", [sql.CLAIM_SESSION, sql.WRITER_SESSION], ids=["claim", "writer"])
def test_a_statement_that_must_scan_is_not_compiled_on_the_dispatchers_sessions(session):
    """With sequential scans off, a scan the planner cannot avoid is costed at 10^10, past every
    JIT threshold: compiled, the queues' controls took 50 ms to read instead of a tenth of one."""
    Queue.objects.create(name="scanned", max_running=2)
    with connection.cursor() as cur:
        cur.execute(session)
        try:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.QUEUE_CONTROLS)
            [explained] = cur.fetchone()[0]
        finally:
            cur.execute("RESET ALL")
    assert explained["Plan"]["Total Cost"] > 1e9, "a scan with sequential scans off, as on these sessions"
    assert "JIT" not in explained
