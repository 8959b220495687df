"""The queues' rows and wake-ups kept by tasks/sql/schema/queues.sql: a row for each queue when its
first task comes (never waiting for another producer), and the NOTIFY when a limited queue's
task ends."""

import threading
import time

import psycopg
import pytest
from django.db import connection

from dispatcher import sql as dispatcher_sql
from tasks.models import Queue
from tasks.services import task_enqueue, task_enqueue_many
from tests.helpers import database_url

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_queue_gets_its_row_with_its_first_task():
    task_enqueue(task_name="t", queue="first")
    task_enqueue_many([{"task_name": "t", "queue": q} for q in ("b", "a", "first", "b")])
    assert list(Queue.objects.values_list("name", flat=True)) == ["a", "b", "first"]
    Queue.objects.filter(name="a").update(max_running=4)
    task_enqueue(task_name="t", queue="a")
    assert Queue.objects.get(name="a").max_running == 4, "an existing row is left as it is"


def test_a_producer_never_waits_for_another_that_holds_a_new_queue_s_first_task():
    """The first task of a new queue sits in a long transaction: other producers of that queue go on."""
    holder = psycopg.connect(database_url())
    try:
        holder.execute("INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count,"
                       " timeout_seconds, metadata, run_at, created_at, updated_at) VALUES (valka_uuid7(), 't',"
                       " 'fresh', 'PENDING', 0, 3, 0, 300, '{}', now(), now(), now())")
        done = threading.Event()

        def other_producer() -> None:
            with psycopg.connect(database_url(), autocommit=True) as conn:
                conn.execute("SET lock_timeout = '5s'")
                conn.execute("INSERT INTO tasks (id, task_name, queue, status, priority, max_retries,"
                             " attempt_count, timeout_seconds, metadata, run_at, created_at, updated_at)"
                             " VALUES (valka_uuid7(), 't', 'fresh', 'PENDING', 0, 3, 0, 300, '{}', now(), now(),"
                             " now())")
            done.set()

        started = time.monotonic()
        thread = threading.Thread(target=other_producer)
        thread.start()
        thread.join(10)
        assert done.is_set() and time.monotonic() - started < 2, "the second producer waited for the first"
        assert not Queue.objects.filter(name="fresh").exists(), "the first one's row is not committed yet"
        holder.commit()
    finally:
        holder.close()
    assert Queue.objects.filter(name="fresh").exists()


def test_a_hello_makes_the_rows_of_its_queues():
    with connection.cursor() as cur:
        cur.execute(dispatcher_sql.ENSURE_QUEUES, {"queues": ["w1", "w2", "w1"]})
    assert list(Queue.objects.values_list("name", flat=True)) == ["w1", "w2"]


def _end(queue: str) -> None:
    with connection.cursor() as cur:
        cur.execute("UPDATE tasks SET status = 'COMPLETED', finished_at = now() WHERE queue = %s", [queue])


def test_a_limited_queue_s_ended_task_wakes_the_dispatchers(listen):
    task_enqueue_many([{"task_name": "t", "queue": "limited"}, {"task_name": "t", "queue": "open"},
                       {"task_name": "t", "queue": "keyed"}])
    Queue.objects.filter(name="limited").update(max_running=2)
    Queue.objects.filter(name="keyed").update(max_running_per_key=1)
    Queue.objects.filter(name="open").update(rate_limit=10)  # no running limit: its slots are the workers'
    heard = listen("valka_queue_slot_freed")
    with connection.cursor() as cur:
        cur.execute("UPDATE tasks SET status = 'RUNNING', started_at = now(), attempt_count = 1")
    for queue in ("limited", "open", "keyed"):
        _end(queue)
    assert heard.drain(2) == ["limited", "keyed"]
