"""Inserting tasks: one statement for one task, one for a batch, NOTIFY included.

The NOTIFY is part of the caller's transaction, so dispatchers hear of a
task only once it is committed, and never of one that was rolled back.
"""

from tasks.notify import TASK_READY

# -- Insert one task; an id or an idempotency key that exists already inserts nothing. --
# `input` and `metadata` arrive as JSON text. Returns what the server set (due and creation
# times); the caller knows the rest. The NOTIFY wakes dispatchers only when the task is
# claimable now, and names it (`queue task_id`: queue names hold no space), so that an idle
# dispatcher can claim it by its id (dispatcher/sql.py CLAIM_IDS). A task alone could go through
# INSERT_TASKS as a batch of one, but this statement enqueues 10-25% faster (docs/performance.md,
# "Hand-made fast paths").
INSERT_TASK = f"""
WITH ins AS (
    INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count,
                       timeout_seconds, idempotency_key, input, metadata, run_at,
                       created_at, updated_at, replayed_from_task_id, replayed_from_dead_letter_id,
                       concurrency_key)
    VALUES (%(id)s, %(task_name)s, %(queue)s, 'PENDING', %(priority)s, %(max_retries)s, 0,
            %(timeout_seconds)s, %(idempotency_key)s, %(input)s::jsonb, %(metadata)s::jsonb,
            COALESCE(%(run_at)s, now()), now(), now(), %(replayed_from_task_id)s,
            %(replayed_from_dead_letter_id)s, %(concurrency_key)s)
    ON CONFLICT DO NOTHING
    RETURNING id, queue, run_at, created_at
)
SELECT ins.run_at, ins.created_at,
       (SELECT count(*) FROM (SELECT pg_notify('{TASK_READY}', ins.queue || ' ' || ins.id::text)
                              WHERE ins.run_at <= now()) n) AS notified
FROM ins
"""

# -- Insert a batch of tasks in one statement; ids or keys that exist already insert nothing. --
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
                       created_at, updated_at, replayed_from_task_id, replayed_from_dead_letter_id,
                       concurrency_key)
    SELECT i.id, i.task_name, i.queue, 'PENDING', i.priority, i.max_retries, 0,
           i.timeout_seconds, i.idempotency_key, i.input, i.metadata,
           COALESCE(i.run_at, now()), now(), now(), i.replayed_from_task_id, i.replayed_from_dead_letter_id,
           i.concurrency_key
    FROM jsonb_to_recordset(%(tasks)s::jsonb)
         AS i(id uuid, task_name text, queue text, priority int, max_retries int, timeout_seconds int,
              idempotency_key text, input jsonb, metadata jsonb, run_at timestamptz,
              replayed_from_task_id uuid, replayed_from_dead_letter_id uuid, concurrency_key text)
    ORDER BY i.idempotency_key, i.id
    ON CONFLICT DO NOTHING
    RETURNING id, queue, run_at
), notified AS (
    SELECT count(pg_notify('{TASK_READY}', ready.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins WHERE run_at <= now()) ready
)
SELECT (SELECT string_agg(id::text, ',') FROM ins) AS ids, now() AS created_at,
       (SELECT n FROM notified) AS notified
"""

# -- The tasks that hold some ids or idempotency keys (after conflicts). --
# ON CONFLICT DO NOTHING names no constraint: its arbiters are the primary key (ids that clients
# made, `POST /api/v1/tasks` with an `id`) and the partial unique index on the key. Ids the server
# makes never conflict.
SELECT_HOLDERS = "SELECT * FROM tasks WHERE id = ANY(%(ids)s::uuid[]) OR idempotency_key = ANY(%(keys)s::text[])"
