"""The statement triggers on tasks, on batches the size the dispatcher writes.

One UPDATE moving hundreds of tasks from different statuses must announce one event per
task that changed, each with the status it came from, and count each finish once. Events
are sent only while a watcher is registered; counting does not depend on one.
"""

import json
import time

import psycopg
import pytest
from django.db import connection

from tasks.services import task_enqueue_many
from tests.helpers import database_url, no_event_watchers_left

pytestmark = pytest.mark.django_db(transaction=True)


def _events(listener: psycopg.Connection) -> list[dict]:
    events = []
    for note in listener.notifies(timeout=2, stop_after=None):
        if note.channel == "valka_task_event":
            events.extend(json.loads(note.payload))
    return events


def test_a_batch_update_announces_each_change_with_its_previous_status():
    tasks = task_enqueue_many([{"task_name": "t", "queue": "trig"}] * 600)
    running = [str(t.id) for t in tasks[:300]]
    with connection.cursor() as cur:  # half the batch RUNNING, half still PENDING
        cur.execute("UPDATE tasks SET status = 'DISPATCHING' WHERE id = ANY(%s::uuid[])", [running])
        cur.execute("UPDATE tasks SET status = 'RUNNING', attempt_count = 1 WHERE id = ANY(%s::uuid[])", [running])
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute("LISTEN valka_task_event")
        listener.execute("SELECT valka_task_events_watch()")
        with connection.cursor() as cur:
            # RUNNING and PENDING → CANCELLED in one statement; a no-op update of other rows changes nothing.
            cur.execute("UPDATE tasks SET status = 'CANCELLED', finished_at = now() WHERE queue = 'trig'")
            cur.execute("UPDATE tasks SET priority = priority WHERE queue = 'trig'")
        events = _events(listener)
    previous = {e["task_id"]: e["previous_status"] for e in events}
    assert len(events) == 600 and len(previous) == 600
    assert {previous[t] for t in running} == {"RUNNING"}
    assert {previous[str(t.id)] for t in tasks[300:]} == {"PENDING"}
    assert {e["new_status"] for e in events} == {"CANCELLED"}
    with connection.cursor() as cur:
        cur.execute("SELECT sum(n), count(*) FROM task_counter_deltas WHERE queue = 'trig' AND kind = 'cancelled'")
        assert cur.fetchone() == (600, 1)  # one row for the statement


def _wait_until_ended(pid: int) -> None:
    """A closed connection's server process exits a moment later."""
    deadline = time.monotonic() + 10
    with connection.cursor() as cur:
        while True:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            if cur.fetchone()[0] == 0 or time.monotonic() > deadline:
                return
            time.sleep(0.02)


def _watchers() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM task_event_watchers")
        return cur.fetchone()[0]


def test_events_are_sent_only_while_someone_watches():
    no_event_watchers_left()
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute("LISTEN valka_task_event")  # listening alone is not watching
        task_enqueue_many([{"task_name": "t", "queue": "unwatched"}] * 3)
        with connection.cursor() as cur:
            cur.execute("UPDATE tasks SET status = 'CANCELLED', finished_at = now() WHERE queue = 'unwatched'")
        assert _events(listener) == []

        listener.execute("SELECT valka_task_events_watch()")
        task_enqueue_many([{"task_name": "t", "queue": "watched"}] * 3)
        assert [e["new_status"] for e in _events(listener)] == ["PENDING"] * 3

        listener.execute("SELECT valka_task_events_unwatch()")
        assert _watchers() == 0
        task_enqueue_many([{"task_name": "t", "queue": "watched"}])
        assert _events(listener) == []
    with connection.cursor() as cur:  # counting never stopped
        cur.execute("SELECT kind, sum(n) FROM task_counter_deltas WHERE queue = 'unwatched' "
                    "GROUP BY kind ORDER BY kind")
        assert cur.fetchall() == [("cancelled", 3), ("created", 3)]


def test_watchers_whose_session_ended_are_pruned():
    no_event_watchers_left()
    with psycopg.connect(database_url(), autocommit=True) as gone:
        gone.execute("SELECT valka_task_events_watch()")
        pid = gone.info.backend_pid
    _wait_until_ended(pid)
    with psycopg.connect(database_url(), autocommit=True) as live:
        live.execute("SELECT valka_task_events_watch()")  # prunes the ended session, registers itself
        assert _watchers() == 1
        live.execute("SELECT valka_task_events_watch()")  # twice is once
        assert _watchers() == 1
        with connection.cursor() as cur:
            cur.execute("SELECT valka_task_event_watchers_prune()")
            assert cur.fetchone()[0] == 0
        pid = live.info.backend_pid
    _wait_until_ended(pid)
    with connection.cursor() as cur:
        cur.execute("SELECT valka_task_event_watchers_prune()")
        assert cur.fetchone()[0] == 1
    assert _watchers() == 0


WORKER = "\x01" * 255  # a worker id of 255 characters, each escaped to six bytes in JSON


@pytest.mark.parametrize("escaped", [
    [0, 342, 388],  # events of about 1.4, 3.7 and 4.3 kB: the last two shared a NOTIFY of over 8,000 bytes
    [400] * 6,
    [0] * 50 + [450] * 4,
])
def test_large_events_are_split_under_the_notify_limit(escaped):
    """A NOTIFY over 8,000 bytes fails the whole statement: events with long error messages and
    worker names (control characters escape to six bytes, quotes to two) still all arrive."""
    tasks = task_enqueue_many([{"task_name": "t", "queue": "big-events"}] * len(escaped))
    with connection.cursor() as cur:
        for task, n in zip(tasks, escaped, strict=True):
            # A worker id of 255 characters that JSON escapes, and an error message sized to the event.
            cur.execute("UPDATE tasks SET status = 'DISPATCHING' WHERE id = %s", [task.id])
            cur.execute("UPDATE tasks SET status = 'RUNNING', attempt_count = 1 WHERE id = %s", [task.id])
            cur.execute("INSERT INTO task_runs (id, task_id, attempt_number, worker_id, status, lease_expires_at) "
                        "VALUES (gen_random_uuid(), %s, 1, %s, 'RUNNING', now() + interval '1 hour')",
                        [task.id, WORKER])
            cur.execute("UPDATE tasks SET error_message = %s WHERE id = %s", ["\x02" * n, task.id])
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute("LISTEN valka_task_event")
        listener.execute("SELECT valka_task_events_watch()")
        with connection.cursor() as cur:
            cur.execute("UPDATE task_runs SET status = 'FAILED', finished_at = now() WHERE task_id = ANY(%s)",
                        [[t.id for t in tasks]])
            cur.execute("UPDATE tasks SET status = 'FAILED', finished_at = now() WHERE queue = 'big-events'")
        payloads = []
        for note in listener.notifies(timeout=2, stop_after=None):
            if note.channel == "valka_task_event":
                payloads.append(note.payload)
    events = [e for p in payloads for e in json.loads(p)]
    assert sorted(e["task_id"] for e in events) == sorted(str(t.id) for t in tasks)
    assert max(len(p.encode()) for p in payloads) < 8000
    assert {e["worker_id"] for e in events} == {WORKER}
