"""What one claim of a queue with max_running costs as the queue's running tasks grow.

The claim counts the queue's DISPATCHING and RUNNING tasks under the queue's lock, up to
max_running (dispatcher/sql.py CLAIM_LIMITED), so its cost grows with the number running; this
says by how much (docs/queues.md, "What they cost"). It times claims of CLAIM_SIZE tasks, in the
dispatcher's way (LOCK_QUEUE and CLAIM_LIMITED in one pipelined transaction, prepared), with none
of the queue's tasks running and with `running` of them, under a max_running above both.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg

from dispatcher import sql

QUEUE = "claim_cost"
CLAIM_SIZE = 64
CLAIMS = 60  # per side; the first WARMUP are not counted (the statements get prepared)
WARMUP = 10
PENDING = CLAIM_SIZE * CLAIMS
INSERT = """
INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count, timeout_seconds,
                   input, metadata, run_at, started_at, created_at, updated_at)
SELECT gen_random_uuid(), 'noop', %(queue)s, CASE WHEN i <= %(running)s THEN 'RUNNING' ELSE 'PENDING' END,
       0, 0, CASE WHEN i <= %(running)s THEN 1 ELSE 0 END, 300, '{}', '{}', now(),
       CASE WHEN i <= %(running)s THEN now() END, now(), now()
FROM generate_series(1, %(running)s + %(pending)s) i
"""


def _claims(url: str, running: int) -> float:
    """The median time of a claim, in ms, with `running` of the queue's tasks RUNNING; each
    claim's tasks are then deleted (no status of theirs changes outside the dispatcher's own
    statements), so the running count stays `running`."""
    with psycopg.connect(url, autocommit=True) as admin, psycopg.connect(url, autocommit=True) as conn:
        admin.execute("DELETE FROM tasks WHERE queue = %s", (QUEUE,))
        admin.execute(INSERT, {"queue": QUEUE, "running": running, "pending": PENDING})
        # The INSERT's trigger made the queue's row (tasks/sql/schema/queues.sql).
        limited = admin.execute("UPDATE queues SET max_running = %s WHERE name = %s", (running + PENDING, QUEUE))
        if limited.rowcount != 1:
            raise RuntimeError(f"queue {QUEUE} has no row to limit")
        admin.execute("VACUUM ANALYZE tasks")
        conn.execute(sql.CLAIM_SESSION)
        params = {"queue": QUEUE, "limit": CLAIM_SIZE, "node_id": "bench-claim-cost"}
        took = []
        for _ in range(CLAIMS):
            began = time.perf_counter()
            with conn.pipeline(), conn.transaction():
                conn.execute(sql.LOCK_QUEUE, params, prepare=True)
                cur = conn.execute(sql.CLAIM_LIMITED, params, prepare=True)
            ids = [row[0] for row in cur.fetchall()[:-1]]
            took.append((time.perf_counter() - began) * 1000)
            if len(ids) != CLAIM_SIZE:
                raise RuntimeError(f"a limited claim took {len(ids)} tasks, not {CLAIM_SIZE}: the timing means nothing")
            admin.execute("DELETE FROM tasks WHERE id = ANY(%s::uuid[])", (ids,))
        admin.execute("DELETE FROM tasks WHERE queue = %s", (QUEUE,))
    return statistics.median(took[WARMUP:])


def measure(url: str, *, running: int = 10_000) -> dict[str, Any]:
    none, many = _claims(url, 0), _claims(url, running)
    return {"claim_size": CLAIM_SIZE, "running": running, "none_running_ms": none, "running_ms": many,
            "ratio": many / none}
