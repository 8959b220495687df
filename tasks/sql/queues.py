"""The queues that hold tasks, found without reading their tasks."""

# -- Every queue that holds a task, one index probe each: a loose scan of tasks_queue_status_idx,
# whose first column is the queue. A recursive CTE for a `WITH RECURSIVE` statement; its last
# row is NULL (the probe past the last queue). --
QUEUES = """queues(queue) AS (
    (SELECT queue FROM tasks ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM tasks t WHERE t.queue > q.queue ORDER BY t.queue LIMIT 1)
    FROM queues q WHERE q.queue IS NOT NULL
)"""
