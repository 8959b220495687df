"""The big table: a million finished tasks and a hundred thousand scheduled for later, in the
very queues the drain and latency workloads use, written with generate_series."""

from __future__ import annotations

import time
from typing import Any

import psycopg

# Finished tasks in the past (spread over a week) and PENDING ones due tomorrow or later.
# session_replication_role = replica skips the tasks triggers (events and counters) for this
# seed only: its million NOTIFY payloads would measure the seed, not the queue.
SEED_FINISHED = """
INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count, timeout_seconds,
                   input, metadata, output, run_at, created_at, updated_at, started_at, finished_at)
SELECT gen_random_uuid(), 'noop', (%(queues)s::text[])[1 + g %% cardinality(%(queues)s::text[])],
       'COMPLETED', 0, 3, 1, 300,
       jsonb_build_object('n', g), '{}', NULL, t, t, t + interval '2 ms', t + interval '1 ms', t + interval '2 ms'
FROM generate_series(1, %(count)s) g,
     LATERAL (SELECT now() - interval '8 days' + g * (interval '7 days' / %(count)s)) AS at(t)
"""
SEED_FUTURE = """
INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count, timeout_seconds,
                   input, metadata, run_at, created_at, updated_at)
SELECT gen_random_uuid(), 'noop', (%(queues)s::text[])[1 + g %% cardinality(%(queues)s::text[])],
       'PENDING', 0, 3, 0, 300,
       jsonb_build_object('n', g), '{}', now() + interval '1 day' + g * interval '1 s', now(), now()
FROM generate_series(1, %(count)s) g
"""


def seed(database_url: str, *, finished: int, future: int, queues: list[str]) -> dict[str, Any]:
    start = time.perf_counter()
    with psycopg.connect(database_url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(SEED_FINISHED, {"queues": queues, "count": finished})
            conn.execute(SEED_FUTURE, {"queues": queues, "count": future})
        conn.execute("VACUUM ANALYZE tasks")
        # The seed writes about a gigabyte of WAL in seconds, where a real table grows over days.
        # Left to itself, the checkpoint it sets off runs during the measured drain (writing the
        # seed's pages, and a full-page image of each page first changed after it began): 10%
        # of the drain's rate, the seed's cost rather than the big table's.
        conn.execute("CHECKPOINT")
        rows = conn.execute("SELECT count(*) FROM tasks").fetchone()
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('tasks'))").fetchone()
    return {"finished": finished, "future": future, "rows": rows[0] if rows else 0,
            "table_size": size[0] if size else "", "seconds": time.perf_counter() - start}
