"""The dispatcher's starts, results and heartbeats in the middle of a drain, before a vacuum.

Every task started and finished since the last vacuum has left an entry behind in each index
on an in-flight state it passed through, while the statistics, taken when little was in
flight, call those states nearly empty. Planned on them, a start once scanned all of those
entries to find the few tasks it starts. Keyed statements must read their rows by key.
"""

import uuid

import pytest
from django.db import connection, transaction

from dispatcher import sql
from tasks.services import task_enqueue_many
from tasks.sql import outcomes
from tests.helpers import no_event_watchers_left
from tests.plans import executed_plan, no_autovacuum, nodes, outline

pytestmark = pytest.mark.django_db(transaction=True)

NODE = "plan-node"
BATCH = 64
BIG_BATCH = 1000  # a pass under load: looking each task up costs more than reading all DISPATCHING ones


def _keyed(node: dict) -> bool:
    """An index read whose condition is on a key: the id, or a run's task."""
    cond = node.get("Index Cond", "")
    return "(id = " in cond or "(task_id = " in cond


def _unkeyed_reads(plan: dict) -> list[dict]:
    """Reads of tasks or task_runs that are not a look-up by key: a sequential scan, an index
    read whole (no index condition), or a range of an index on something else (a status)."""
    return [n for n in nodes(plan)
            if (n["Node Type"] == "Seq Scan" and n.get("Relation Name") in ("tasks", "task_runs"))
            or (n.get("Index Name", "").startswith(("tasks_", "task_runs_")) and not _keyed(n))]


def _pairwise_comparisons(plan: dict) -> int:
    """Rows joins compared and threw away: a batch matched row by row against another side."""
    return sum(n.get("Rows Removed by Join Filter", 0) for n in nodes(plan))


def _claim(n: int) -> list[str]:
    with connection.cursor() as cur:
        cur.execute(sql.CLAIM, sql.claim_params(queue="writer", limit=n, node_id=NODE))
        return [row[0] for row in cur.fetchall()]


def _seq_scans_of_tasks(cur) -> int:
    cur.execute("SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'tasks'")
    return cur.fetchone()[0]


def _start(task_ids: list[str]) -> dict:
    return {"task_ids": task_ids, "run_ids": [str(uuid.uuid4()) for _ in task_ids],
            "worker_ids": ["w1"] * len(task_ids), "node_id": NODE}


@pytest.fixture
def after_a_drain():
    """3,000 tasks claimed, started and completed with no vacuum since; analyzed once they were done."""
    with no_autovacuum("tasks", "task_runs"):
        with connection.cursor() as cur:
            for _ in range(3):
                task_enqueue_many([{"task_name": "t", "queue": "writer"}] * 1000)
                start = _start(_claim(1000))
                cur.execute(sql.START_RUNS, start)
                cur.execute(outcomes.COMPLETE_RUNS, outcomes._params(start["run_ids"], start["worker_ids"],
                                                                     ["{}"] * 1000))
            cur.execute("ANALYZE tasks")
            cur.execute("ANALYZE task_runs")
        task_enqueue_many([{"task_name": "t", "queue": "writer"}] * BIG_BATCH)
        yield


@pytest.mark.parametrize("batch", [BATCH, BIG_BATCH])
@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_a_start_reads_the_tasks_it_starts_by_id(after_a_drain, generic, batch):
    """The statistics say no task is DISPATCHING. A plan that believed them read the DISPATCHING
    tasks first and compared each with every task of the batch: 2.2 million comparisons for a
    pass of 1,500 starts, 1.5 s."""
    plan = executed_plan(sql.START_RUNS, _start(_claim(batch)), generic=generic, session=sql.WRITER_SESSION)
    assert plan["Actual Rows"] == batch
    assert not _unkeyed_reads(plan), outline(plan)
    assert _pairwise_comparisons(plan) == 0, outline(plan)


@pytest.mark.parametrize("batch", [BATCH, BIG_BATCH])
@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_a_start_written_with_its_result_reads_its_tasks_by_id(after_a_drain, generic, batch):
    """As a start: each task looked up by id, and moved by its address, not found by a join."""
    no_event_watchers_left()  # while task events are watched, the start and the result are written apart
    start = _start(_claim(batch))
    plan = executed_plan(sql.START_COMPLETED_RUNS, {**start, "values": ["{}"] * batch}, generic=generic,
                         session=sql.WRITER_SESSION)
    assert plan["Actual Rows"] == batch
    assert not _unkeyed_reads(plan), outline(plan)
    assert _pairwise_comparisons(plan) == 0, outline(plan)


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_results_and_heartbeats_read_their_runs_by_id(after_a_drain, generic):
    start = _start(_claim(BATCH))
    with connection.cursor() as cur:
        cur.execute(sql.START_RUNS, start)
    beat = executed_plan(sql.HEARTBEAT, {"worker_ids": start["worker_ids"], "task_ids": start["task_ids"],
                                         "extension": 30}, generic=generic, session=sql.WRITER_SESSION)
    assert beat["Actual Rows"] == BATCH
    assert not _unkeyed_reads(beat), outline(beat)
    done = executed_plan(outcomes.COMPLETE_RUNS,
                         outcomes._params(start["run_ids"], start["worker_ids"], ["{}"] * BATCH),
                         generic=generic, session=sql.WRITER_SESSION)
    assert done["Actual Rows"] == BATCH
    assert not _unkeyed_reads(done), outline(done)


def test_run_inserts_check_their_task_by_key_after_the_table_grew():
    """The foreign key check of a new run is planned once per connection, and kept. Planned while
    `tasks` was nearly empty, as when a dispatcher starts on a young table, it scanned the whole
    table for every run once the table had grown (until a vacuum or analyze replanned it)."""
    def start_runs(n: int) -> int:
        """Starts n new tasks with the foreign key checked at once; the sequential scans of tasks
        that took in this transaction."""
        task_enqueue_many([{"task_name": "t", "queue": "writer"}] * n)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
            ids = _claim(n)
            # A backend's counts reach the statistics views at most once a second, so the view also
            # shows scans of earlier transactions not reported yet: count around the start only.
            before = _seq_scans_of_tasks(cur)
            cur.execute(sql.START_RUNS, _start(ids))
            assert len(cur.fetchall()) == n
            return _seq_scans_of_tasks(cur) - before

    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE tasks")
        cur.execute(sql.WRITER_SESSION)
    try:
        for _ in range(8):  # the check's plan is cached for the connection after five
            start_runs(1)
        task_enqueue_many([{"task_name": "t", "queue": "grown"}] * 1000)
        task_enqueue_many([{"task_name": "t", "queue": "grown"}] * 1000)
        assert start_runs(BATCH) == 0
    finally:
        with connection.cursor() as cur:
            cur.execute("RESET ALL")


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
def test_results_read_their_tasks_by_id_when_the_statistics_disagree(generic):
    """Analyzed on a young table, `task_runs` says most runs are RUNNING while `tasks`, analyzed
    when its tasks were all PENDING, says none is: a batch of results then looks large on one side
    and its tasks look empty on the other, the shape that made starts compare every DISPATCHING
    task with the whole batch. The runs may be read whole on a table this young (a read the
    planner stops choosing as the table grows); the tasks are looked up by id."""
    with no_autovacuum("tasks", "task_runs"), connection.cursor() as cur:
        task_enqueue_many([{"task_name": "t", "queue": "writer"}] * 1000)
        task_enqueue_many([{"task_name": "t", "queue": "writer"}] * 1000)
        cur.execute("ANALYZE tasks")
        cur.execute(sql.START_RUNS, _start(_claim(200)))
        cur.execute("ANALYZE task_runs")
        start = _start(_claim(BIG_BATCH))
        cur.execute(sql.START_RUNS, start)
        done = executed_plan(outcomes.COMPLETE_RUNS,
                             outcomes._params(start["run_ids"], start["worker_ids"], ["{}"] * BIG_BATCH),
                             generic=generic, session=sql.WRITER_SESSION)
    assert done["Actual Rows"] == BIG_BATCH
    assert not [n for n in _unkeyed_reads(done) if n.get("Relation Name") == "tasks"], outline(done)
    assert _pairwise_comparisons(done) == 0, outline(done)
