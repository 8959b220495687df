"""Pages of bounded cost: cursors reach any depth, offsets stop at MAX_OFFSET, and a count past
COUNT_CAP rows is PostgreSQL's estimate, said so."""

from __future__ import annotations

import pytest
from django.db import connection

from tasks import selectors
from tasks.api.pagination import MAX_OFFSET, after_cursor, cursor_of
from tasks.dashboard import COUNT_CAP
from tasks.models import Task
from tasks.services import task_enqueue_many
from tests.factories import DeadLetterFactory, SignalFactory, TaskFactory, TaskLogFactory, TaskRunFactory, WorkerFactory
from tests.helpers import assert_error
from tests.plans import nodes, outline

URL = "/api/v1/tasks"


def _walk(client, url: str, **params) -> list[str]:
    """Every id of a list, page after page, following `next`."""
    ids, page = [], client.get(url, params).json()
    while True:
        ids += [row["id"] for row in page["results"]]
        assert page["has_more"] == (page["next"] is not None) == (page["next_cursor"] is not None)
        if not page["has_more"]:
            return ids
        assert "offset=" not in page["next"] and page["previous"] is None or "cursor=" in page["next"]
        page = client.get(page["next"]).json()


@pytest.mark.django_db
def test_following_next_visits_every_row_once_in_order(client_api):
    # Tasks of one batch share their created_at (one transaction): the cursor breaks the tie by id.
    task_enqueue_many([{"task_name": "batch", "queue": "q"}] * 7)
    for _ in range(4):
        TaskFactory(queue="q")
    everything = [row["id"] for row in client_api.get(URL, {"limit": 100}).json()["results"]]
    assert len(everything) == 11
    assert _walk(client_api, URL, limit=2) == everything
    assert _walk(client_api, URL, limit=3, queue="q") == everything
    assert _walk(client_api, URL, limit=1, task_name="batch") == [i for i in everything
                                                                 if Task.objects.get(id=i).task_name == "batch"]


@pytest.mark.django_db
def test_every_list_endpoint_pages_by_cursor(client_api):
    run = TaskRunFactory()
    lists = {
        "/api/v1/dead-letters": [DeadLetterFactory() for _ in range(5)],
        "/api/v1/workers": [WorkerFactory() for _ in range(5)],
        f"/api/v1/tasks/{run.task_id}/signals": [SignalFactory(task=run.task) for _ in range(5)],
        f"/api/v1/tasks/{run.task_id}/runs/{run.id}/logs": [TaskLogFactory(run=run) for _ in range(5)],
    }
    for url, rows in lists.items():
        everything = [row["id"] for row in client_api.get(url, {"limit": 100}).json()["results"]]
        assert sorted(map(str, everything)) == sorted(str(row.id) for row in rows), url
        assert _walk(client_api, url, limit=2) == everything, url


@pytest.mark.django_db
def test_counts_are_exact_up_to_the_cap_then_estimated(client_api):
    TaskFactory.create_batch(3)
    body = client_api.get(URL, {"limit": 2}).json()
    assert (body["count"], body["count_exact"], body["has_more"]) == (3, True, True)
    Task.objects.bulk_create([Task(task_name="many", queue="q") for _ in range(COUNT_CAP + 2)])
    body = client_api.get(URL, {"limit": 2}).json()
    assert body["count_exact"] is False and body["count"] > COUNT_CAP and body["has_more"]
    body = client_api.get(URL, {"task_name": "many", "limit": 2}).json()
    assert body["count_exact"] is False and body["count"] > COUNT_CAP
    body = client_api.get(URL, {"queue": "default", "limit": 2}).json()
    assert (body["count"], body["count_exact"]) == (3, True)


@pytest.mark.django_db
def test_offsets_stop_at_the_cap_and_cursors_are_checked(client_api):
    TaskFactory.create_batch(3)
    assert client_api.get(URL, {"offset": MAX_OFFSET}).status_code == 200
    assert_error(client_api.get(URL, {"offset": MAX_OFFSET + 1}), 400, "VALIDATION_ERROR", "offset")
    cursor = client_api.get(URL, {"limit": 1}).json()["next_cursor"]
    assert_error(client_api.get(URL, {"cursor": cursor, "offset": 1}), 400, "VALIDATION_ERROR", "offset")
    for bad in ["nope", "WyJ4Il0", "W10", "bnVsbA", "x" * 600, "WyIyMDI2LTAxLTAxIiwgbnVsbF0"]:
        assert_error(client_api.get(URL, {"cursor": bad}), 400, "VALIDATION_ERROR", "cursor")
    for url in ("/api/v1/dead-letters", "/api/v1/workers"):
        assert_error(client_api.get(url, {"cursor": "nope"}), 400, "VALIDATION_ERROR", "cursor")


@pytest.mark.long
@pytest.mark.django_db(transaction=True)
def test_page_ten_thousand_of_a_million_tasks_reads_one_page():
    """The 10,000th page of 50 (row 500,000 of a million), reached by cursor: the plan starts at the
    cursor in the created_at index and reads one page of rows, not the half million before it."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO tasks (id, task_name, queue, status, input, metadata, priority, max_retries,
                               attempt_count, timeout_seconds, run_at, created_at, updated_at, finished_at)
            SELECT valka_uuid7(), 'bulk', 'bulk', 'COMPLETED', '{}', '{}', 0, 3, 1, 300, now(),
                   now() - n * interval '1 millisecond', now(), now()
            FROM generate_series(1, 1000000) n""")
        cursor.execute("ANALYZE tasks")
    listing = selectors.task_list()
    row = listing[499_999]
    page = after_cursor(listing, cursor_of(row, listing))[:51]  # a page of 50 and the look-ahead row
    statement, params = page.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", params)
        plan = cursor.fetchone()[0][0]["Plan"]
    shown = outline(plan)
    reads = [n for n in nodes(plan) if n.get("Relation Name") == "tasks"]
    assert [n["Node Type"] for n in reads] == ["Index Scan"] and reads[0]["Index Name"] == "tasks_created_idx", shown
    # A page, the look-ahead row, and the next entry that tells the incremental sort its tie group ended.
    assert reads[0]["Actual Rows"] <= 52 and reads[0]["Actual Loops"] == 1, shown
    assert plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0) < 200, shown
    assert [t.id for t in page][:1] == [listing[500_000].id]
