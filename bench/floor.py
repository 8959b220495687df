"""The raw-SQL floor: what PostgreSQL alone does for a queue on this machine, with no Python
task handling and no network hop beyond psycopg, in a bare table of its own database (the
queue's own tables and triggers are untouched). Drain: rows claimed 100 at a time with
SKIP LOCKED, then marked done (two commits per 100), by two connections. Enqueue: one
INSERT and one commit per row, from one connection; and from 8 processes at once, with and
without a NOTIFY in each transaction, as every enqueue of a task due now sends one.

PostgreSQL holds one lock from a notifying transaction's commit until its commit record is
flushed, so notifying commits wait for each other's WAL flush instead of sharing one: the
two concurrent figures show what that costs enqueue from many callers on this machine. One more
figure is not bare: one INSERT + NOTIFY + commit per row into Valka's own tasks table, which shows
what the table's indexes and triggers cost a single enqueue before Valka's Python. And the time of
one bare INSERT + commit, paced in turns with the latency workload's enqueues (`commit_timer`).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from bench.measure import rounds_summary, wait_until_done
from tasks.notify import TASK_READY

SCHEMA = """
CREATE TABLE IF NOT EXISTS floor_jobs (
    id bigserial PRIMARY KEY, queue text NOT NULL, status text NOT NULL, payload jsonb,
    created_at timestamptz NOT NULL DEFAULT now(), finished_at timestamptz);
CREATE INDEX IF NOT EXISTS floor_jobs_pending ON floor_jobs (queue, id) WHERE status = 'pending';
"""
CLAIM = """
UPDATE floor_jobs SET status = 'running' WHERE id IN (
    SELECT id FROM floor_jobs WHERE status = 'pending' AND queue = 'floor' ORDER BY id
    LIMIT 100 FOR UPDATE SKIP LOCKED)
RETURNING id
"""
FINISH = "UPDATE floor_jobs SET status = 'done', finished_at = now() WHERE id = ANY(%s)"


DRAIN_CONNECTIONS = 2


def drain(database_url: str, *, n: int, rounds: int) -> dict[str, Any]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rates = [drain_round(conn, database_url, n=n, desc=f"raw SQL floor {r + 1}/{rounds}") for r in range(rounds)]
    return rounds_summary(rates, n=n, connections=DRAIN_CONNECTIONS)


def drain_round(conn: psycopg.Connection, database_url: str, *, n: int, desc: str) -> float:
    """One drain of `n` rows by DRAIN_CONNECTIONS connections to `database_url`; `conn`, on the
    same database, fills the table and counts what is done. Answers the rate per second."""
    conn.execute(SCHEMA)
    conn.execute("TRUNCATE floor_jobs")
    conn.execute("INSERT INTO floor_jobs (queue, status, payload) "
                 "SELECT 'floor', 'pending', '{}' FROM generate_series(1, %s)", (n,))
    conn.execute("VACUUM ANALYZE floor_jobs")
    start = time.time()
    threads = [threading.Thread(target=_consume, args=(database_url,)) for _ in range(DRAIN_CONNECTIONS)]
    for t in threads:
        t.start()
    wait_until_done(lambda: conn.execute("SELECT count(*) FROM floor_jobs WHERE status = 'done'")
                    .fetchone()[0], n, desc, 120)  # type: ignore[index]
    for t in threads:
        t.join()
    last = conn.execute("SELECT max(finished_at) FROM floor_jobs").fetchone()[0]  # type: ignore[index]
    return n / max(last.timestamp() - start, 1e-6)


def _consume(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        while True:
            ids = [row[0] for row in conn.execute(CLAIM).fetchall()]
            if not ids:
                return
            conn.execute(FINISH, (ids,))


def enqueue_single(database_url: str, count: int) -> dict[str, Any]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SCHEMA)
        start = time.perf_counter()
        for i in range(count):
            conn.execute("INSERT INTO floor_jobs (queue, status, payload) VALUES ('single', 'pending', %s)",
                         (f'{{"i": {i}}}',))
        seconds = time.perf_counter() - start
    return {"rate_per_s": count / seconds, "count": count}


def commit_timer(conn: psycopg.Connection) -> Callable[[], float]:
    """One bare INSERT + commit per call on `conn` (autocommit, in a database with SCHEMA): its
    time in ms. The latency workload takes it in turns with its enqueues (bench/drain.py
    `latency`): a durable commit's own time at the same pace, in the same moments."""
    def commit() -> float:
        start = time.perf_counter()
        conn.execute("INSERT INTO floor_jobs (queue, status, payload) VALUES ('latency', 'pending', '{}')",
                     prepare=True)
        return (time.perf_counter() - start) * 1000

    return commit


# One task's row in Valka's own tasks table, with the NOTIFY that every enqueue of a task due now
# sends, from bare psycopg (prepared, autocommit): what the table's indexes and triggers leave of
# the bare floor above before any of Valka's Python runs. Run in Valka's database, on a queue no
# worker serves; its rows are deleted afterwards.
TASKS_TABLE_QUEUE = "floor_tasks_table"
TASKS_TABLE_INSERT = f"""
WITH ins AS (
    INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count, timeout_seconds,
                       input, metadata, run_at, created_at, updated_at)
    VALUES (%s, 'noop', '{TASKS_TABLE_QUEUE}', 'PENDING', 0, 3, 0, 300, %s::jsonb, '{{}}', now(), now(), now())
    RETURNING queue, id
)
SELECT pg_notify('{TASK_READY}', queue || ' ' || id::text) FROM ins
"""


def enqueue_tasks_table(database_url: str, count: int) -> dict[str, Any]:
    """TASKS_TABLE_INSERT, one row and one commit per call, from one connection."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        start = time.perf_counter()
        for i in range(count):
            conn.execute(TASKS_TABLE_INSERT, (uuid.uuid4(), f'{{"i": {i}}}'), prepare=True)
        seconds = time.perf_counter() - start
        conn.execute("DELETE FROM tasks WHERE queue = %s", (TASKS_TABLE_QUEUE,))
    return {"rate_per_s": count / seconds, "count": count}


CONCURRENT_SECONDS = 3.0
INSERT = "INSERT INTO floor_jobs (queue, status, payload) VALUES ('concurrent', 'pending', '{}')"
INSERT_NOTIFY = ("WITH i AS (" + INSERT + " RETURNING queue) SELECT pg_notify('floor_ready', queue) FROM i")


def enqueue_concurrent(database_url: str, *, callers: int = 8, notify: bool) -> dict[str, Any]:
    """INSERT + commit from `callers` processes (threads would share one interpreter lock) for
    CONCURRENT_SECONDS, each INSERT with a NOTIFY in its statement when `notify`; a connection
    LISTENs meanwhile, as a dispatcher does.

    The processes start together once all have connected (a barrier): on a busy machine starting
    them takes seconds, and a caller that started late would have counted nothing in the window."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("LISTEN floor_ready")
        context = multiprocessing.get_context("spawn")  # a clean process: no inherited connections
        ready, counts = context.Barrier(callers), context.Queue()
        procs = [context.Process(target=_insert_loop, args=(database_url, notify, CONCURRENT_SECONDS, ready, counts))
                 for _ in range(callers)]
        for proc in procs:
            proc.start()
        try:
            total = sum(counts.get(timeout=120) for _ in procs)
        finally:
            for proc in procs:
                proc.join(10)
    return {"rate_per_s": total / CONCURRENT_SECONDS, "count": total, "callers": callers,
            "notify": notify, "seconds": CONCURRENT_SECONDS}


def _insert_loop(database_url: str, notify: bool, seconds: float, ready: Any, counts: Any) -> None:
    statement = INSERT_NOTIFY if notify else INSERT
    with psycopg.connect(database_url, autocommit=True) as conn:
        ready.wait(60)
        count, end = 0, time.time() + seconds
        while time.time() < end:
            conn.execute(statement)
            count += 1
    counts.put(count)
