"""The reads behind `GET /metrics` (tasks.metrics) that tasks.dashboard does not already make."""

from tasks.sql.queues import PAUSED_NOW
from tasks.states import FINAL_STATES

# -- Every queue that has a row, and whether its pause is in force. --
QUEUES_PAUSED = f"SELECT q.name, {PAUSED_NOW} FROM queues q ORDER BY q.name"

# -- Workers connected to a dispatcher. --
WORKERS_CONNECTED = "SELECT count(*) FROM workers WHERE status = 'CONNECTED'"

# -- Dispatch latency (due → RUNNING) of the runs started in the window, newest first. --
# Run ids are UUIDv7 minted at dispatch, so the primary key finds the window without another index.
RECENT_DISPATCH_LATENCY = """
SELECT GREATEST(EXTRACT(EPOCH FROM r.started_at - t.run_at), 0)::float8
FROM task_runs r JOIN tasks t ON t.id = r.task_id
WHERE r.id >= %(low_id)s AND r.started_at >= now() - make_interval(secs => %(window)s)
ORDER BY r.id DESC LIMIT %(limit)s
"""

# -- Run duration of the last attempt of the tasks that finished in the window (tasks_finished_idx). --
RECENT_RUN_DURATION = f"""
SELECT GREATEST(EXTRACT(EPOCH FROM r.finished_at - r.started_at), 0)::float8
FROM (SELECT id, attempt_count FROM tasks
      WHERE status IN ({", ".join(f"'{s.value}'" for s in sorted(FINAL_STATES))})
        AND finished_at >= now() - make_interval(secs => %(window)s)
      ORDER BY finished_at DESC LIMIT %(limit)s) t
JOIN task_runs r ON r.task_id = t.id AND r.attempt_number = t.attempt_count
WHERE r.finished_at IS NOT NULL
"""

# -- Bucket counts, sum and count over a sample query (bounds are code constants). --
# `{buckets}` is one HISTOGRAM_BUCKET per bound, comma-separated; `{sample}` one of the queries above.
HISTOGRAM = """
SELECT count(*), COALESCE(sum(v), 0)::float8, {buckets} FROM ({sample}) AS s(v)
"""

# -- One cumulative bucket of HISTOGRAM: the sampled values at or below `{bound}` (a float). --
HISTOGRAM_BUCKET = "count(*) FILTER (WHERE v <= {bound!r})"
