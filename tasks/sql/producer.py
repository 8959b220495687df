"""Inserting tasks: one statement for a batch of any size (one task is a batch of one), NOTIFY included.

The NOTIFY is part of the caller's transaction, so dispatchers hear of a
task only once it is committed, and never of one that was rolled back.
"""

from tasks.notify import TASK_READY

# -- Insert a batch of tasks in one statement; keys that exist already insert nothing. --
# The batch travels as one JSON array of objects (ids made by the caller), unpacked by
# jsonb_to_recordset: cheaper to send than one array per column, and one statement text for
# every batch size, so it is prepared once per connection (tasks.prepared). Rows go in key
# order, so two batches sharing keys take them in the same order and cannot deadlock on each
# other's uncommitted rows. Sends one NOTIFY per distinct queue that got a task claimable now, not
# one per task. Answers with one row: the ids inserted (comma-separated text, which costs
# nothing to read back) and the statement's now(), which is every new row's creation time
# and the due time of those that were given none.
INSERT_TASKS = f"""
WITH ins AS (
    INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count,
                       timeout_seconds, idempotency_key, input, metadata, run_at,
                       created_at, updated_at, replayed_from_task_id, replayed_from_dead_letter_id)
    SELECT i.id, i.task_name, i.queue, 'PENDING', i.priority, i.max_retries, 0,
           i.timeout_seconds, i.idempotency_key, i.input, i.metadata,
           COALESCE(i.run_at, now()), now(), now(), i.replayed_from_task_id, i.replayed_from_dead_letter_id
    FROM jsonb_to_recordset(%(tasks)s::jsonb)
         AS i(id uuid, task_name text, queue text, priority int, max_retries int, timeout_seconds int,
              idempotency_key text, input jsonb, metadata jsonb, run_at timestamptz,
              replayed_from_task_id uuid, replayed_from_dead_letter_id uuid)
    ORDER BY i.idempotency_key, i.id
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, run_at
), notified AS (
    SELECT count(pg_notify('{TASK_READY}', ready.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins WHERE run_at <= now()) ready
)
SELECT (SELECT string_agg(id::text, ',') FROM ins) AS ids, now() AS created_at,
       (SELECT n FROM notified) AS notified
"""

# -- The tasks that hold some idempotency keys (after conflicts in a batch). --
SELECT_BY_IDEMPOTENCY_KEYS = "SELECT * FROM tasks WHERE idempotency_key = ANY(%(keys)s::text[])"
