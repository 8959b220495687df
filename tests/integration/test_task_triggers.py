"""The statement triggers on tasks, on batches the size the dispatcher writes.

One UPDATE moving hundreds of tasks from different statuses must announce one event per
task that changed, each with the status it came from, and count each finish once.
"""

import json

import psycopg
import pytest
from django.db import connection

from tasks.services import task_enqueue_many
from tests.helpers import database_url

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
        cur.execute("SELECT sum(n) FROM task_counters WHERE queue = 'trig' AND kind = 'cancelled'")
        assert cur.fetchone()[0] == 600
