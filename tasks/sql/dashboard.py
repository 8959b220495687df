"""The reads behind the admin's overview and list filters (tasks.dashboard), and /healthz.

None counts the tasks table whole: each walks an index for a bounded number of
entries (tasks.dashboard's docstring says how), and throughput comes from
`task_counters` and `task_counter_deltas` (tasks/sql/schema/counters.sql).
"""

from tasks.sql.queues import QUEUES

# -- Distinct values of an indexed column, one index probe each (table, column are constants). --
LOOSE_DISTINCT = """
WITH RECURSIVE v(value) AS (
    (SELECT {column} FROM {table} ORDER BY {column} LIMIT 1)
    UNION ALL
    SELECT (SELECT t.{column} FROM {table} t WHERE t.{column} > v.value ORDER BY t.{column} LIMIT 1)
    FROM v WHERE v.value IS NOT NULL
)
SELECT value FROM v WHERE value IS NOT NULL LIMIT %(limit)s
"""

# -- Tasks by queue × status: each (queue, status) pair found by a probe, then a capped count. --
STATUS_COUNTS = """
WITH RECURSIVE pairs(queue, status) AS (
    (SELECT queue, status FROM tasks ORDER BY queue, status LIMIT 1)
    UNION ALL
    SELECT n.queue, n.status FROM pairs p CROSS JOIN LATERAL (
        SELECT t.queue, t.status FROM tasks t
        WHERE (t.queue, t.status) > (p.queue, p.status)
        ORDER BY t.queue, t.status LIMIT 1
    ) n
)
SELECT p.queue, p.status,
       (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.queue = p.queue AND t.status = p.status
                              LIMIT %(cap)s) capped) AS n
FROM pairs p
WHERE %(statuses)s::text[] IS NULL OR p.status = ANY(%(statuses)s::text[])
LIMIT %(limit)s
"""

# -- Oldest due PENDING task per queue. --
# The queues are found one index probe each (QUEUES); the head of each (queue, PENDING, priority)
# range of tasks_queue_status_idx is that priority's earliest run_at, and the earliest head that
# is due is the queue's oldest due task. One probe per queue and per (queue, priority) pair.
QUEUE_LAG = f"""
WITH RECURSIVE {QUEUES}, heads(queue, priority, run_at) AS (
    SELECT h.queue, h.priority, h.run_at FROM queue_names q CROSS JOIN LATERAL (
        SELECT t.queue, t.priority, t.run_at FROM tasks t
        WHERE t.queue = q.queue AND t.status = 'PENDING'
        ORDER BY t.priority DESC, t.run_at, t.id LIMIT 1
    ) h
    WHERE q.queue IS NOT NULL
    UNION ALL
    SELECT n.queue, n.priority, n.run_at FROM heads h CROSS JOIN LATERAL (
        SELECT t.queue, t.priority, t.run_at FROM tasks t
        WHERE t.queue = h.queue AND t.status = 'PENDING' AND t.priority < h.priority
        ORDER BY t.priority DESC, t.run_at, t.id LIMIT 1
    ) n
)
SELECT queue,
       EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now())
                          - min(run_at) FILTER (WHERE run_at <= COALESCE(%(now)s::timestamptz, now())))
FROM heads GROUP BY queue
"""

# -- Connected workers with their RUNNING runs (partial index task_runs_worker_idx). --
CONNECTED_WORKERS = """
SELECT w.id, w.name, w.queues, w.concurrency, w.node_id, w.connected_at, w.last_heartbeat_at,
       (SELECT count(*) FROM task_runs r
        WHERE r.worker_id = w.id AND r.finished_at IS NULL AND r.status = 'RUNNING') AS in_flight
FROM workers w
WHERE w.status = 'CONNECTED'
ORDER BY w.name, w.id
LIMIT %(limit)s
"""

# -- Every count: the counter table's and the deltas not folded into it yet (a few seconds' worth,
# tasks/sql/schema/counters.sql). The readers' conditions reach each table through the UNION ALL,
# the counters' primary key included. --
COUNTED = """(
    SELECT minute, queue, kind, n FROM task_counters
    UNION ALL SELECT minute, queue, kind, n FROM task_counter_deltas
) counted"""

# -- Per-minute throughput of the last hour, all queues. --
THROUGHPUT = f"""
SELECT minute, kind, sum(n)::bigint FROM {COUNTED}
WHERE minute > date_trunc('minute', COALESCE(%(now)s::timestamptz, now())) - make_interval(mins => %(minutes)s)
  AND kind = ANY(%(kinds)s)
GROUP BY minute, kind
"""

# -- Totals since the counters began, by queue and kind. --
COUNTER_TOTALS = f"SELECT queue, kind, sum(n)::bigint FROM {COUNTED} GROUP BY queue, kind"

# -- One cell of the queue × status grid, for the planner's estimate when its count was capped. --
CELL = "SELECT 1 FROM tasks WHERE queue = %(queue)s AND status = %(status)s"

# -- The planner's row estimate of a table, from the last VACUUM/ANALYZE (-1: never analyzed). --
RELTUPLES = "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%(table)s)"

# -- The plan of a statement (`{statement}`), as JSON: the planner's row estimate, nothing read. --
EXPLAIN = "EXPLAIN (FORMAT JSON) {statement}"

# -- No JIT compilation for the rest of the transaction, for STATUS_COUNTS (see tasks.dashboard._rows). --
JIT_OFF = "SET LOCAL jit = off"

# -- /healthz: the database answers. --
PING = "SELECT 1"
