"""Queues: those that hold tasks, found without reading their tasks, and the queues table's rows
(tasks.models.Queue): their settings' reads and writes, and the rules the claims apply."""

from tasks.notify import QUEUE_CHANGED

# -- Every queue that holds a task, one index probe each: a loose scan of tasks_queue_status_idx,
# whose first column is the queue. A recursive CTE, `queue_names(queue)`, for a `WITH RECURSIVE`
# statement; its last row is NULL (the probe past the last queue). --
QUEUES = """queue_names(queue) AS (
    (SELECT queue FROM tasks ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM tasks t WHERE t.queue > q.queue ORDER BY t.queue LIMIT 1)
    FROM queue_names q WHERE q.queue IS NOT NULL
)"""

# -- The rules, as expressions over a queues row `q`. --
# Its pause is in force: paused, with no end or an end still to come (a pause ends by itself).
PAUSED_NOW = "(q.paused AND (q.paused_until IS NULL OR q.paused_until > now()))"
# Its claims must go through the limited claim (dispatcher/sql.py CLAIM_LIMITED): paused, or a limit set.
CONTROLLED = (f"({PAUSED_NOW} OR q.max_running IS NOT NULL OR q.rate_limit IS NOT NULL "
              "OR q.max_running_per_key IS NOT NULL)")

# -- The queues that have a row, tasks, or a worker (connected or not) serving them. --
KNOWN_QUEUES = f"""
WITH RECURSIVE {QUEUES}
SELECT name FROM queues
UNION SELECT queue FROM queue_names WHERE queue IS NOT NULL
UNION SELECT unnest(w.queues) FROM workers w
ORDER BY 1
"""

# -- The rows of queues `names`, with whether each one's pause is in force now. --
QUEUE_ROWS = f"SELECT q.*, {PAUSED_NOW} AS paused_now FROM queues q WHERE q.name = ANY(%(names)s) ORDER BY q.name"

# -- One queue's tasks by status, each count capped at %(cap)s (one range of tasks_queue_status_idx each). --
QUEUE_STATUS_COUNTS = """
SELECT s.status, (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.queue = %(name)s AND t.status = s.status
                                         LIMIT %(cap)s) capped)
FROM unnest(%(statuses)s::text[]) AS s(status)
"""

# -- Whether a queue has tasks or a worker serving it (it may not have its row yet). --
QUEUE_IN_USE = """
SELECT EXISTS (SELECT 1 FROM tasks WHERE queue = %(name)s)
    OR EXISTS (SELECT 1 FROM workers WHERE %(name)s = ANY(queues))
"""

# -- A queue's row, made first if the queue has tasks or a worker and no row yet (a row missed
# when its first task came: tasks/sql/schema/queues.sql). Answers nothing for an unknown queue. --
ENSURE_QUEUE = """
SELECT valka_queues_ensure(ARRAY[%(name)s])
WHERE EXISTS (SELECT 1 FROM tasks WHERE queue = %(name)s)
   OR EXISTS (SELECT 1 FROM workers WHERE %(name)s = ANY(queues))
"""

# -- Pause a queue (until a time, or until resumed); resume it. Each wakes the dispatchers, which
# reread the queue's settings (their claims check the row themselves: a dispatcher that has not
# heard yet starts nothing the change forbids). --
PAUSE_QUEUE = f"""
WITH changed AS (
    UPDATE queues SET paused = %(paused)s, paused_until = %(until)s, updated_at = now()
    WHERE name = %(name)s
    RETURNING *
)
SELECT changed.*, pg_notify('{QUEUE_CHANGED}', changed.name)::text FROM changed
"""

# -- Set a queue's limits and description: `{{assignments}}` are the caller's `column = %(column)s`
# for the settings it changes (code constants). A rate limit set anew starts with an empty window. --
UPDATE_QUEUE = f"""
WITH changed AS (
    UPDATE queues SET {{assignments}}, updated_at = now()
    WHERE name = %(name)s
    RETURNING *
)
SELECT changed.*, pg_notify('{QUEUE_CHANGED}', changed.name)::text FROM changed
"""

# -- UPDATE_QUEUE's assignments when the rate limit is removed (its window goes with it; a rate
# limit changed keeps its window, which stays true) and when max_running_per_key is (its turn). --
CLEAR_RATE_WINDOW = "rate_stamps = NULL, rate_counts = NULL, rate_pending = 0"
CLEAR_KEY_TURN = "key_cursor = NULL"
