"""Inserting tasks: one statement per task (or per batch), NOTIFY included.

The NOTIFY is part of the caller's transaction, so dispatchers hear of a
task only once it is committed, and never of one that was rolled back.
"""

from tasks.notify import TASK_READY

# -- Insert one task; an idempotency key that exists already inserts nothing. --
# The NOTIFY wakes dispatchers only when the task is claimable now.
INSERT_TASK = f"""
WITH ins AS (
    INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count,
                       timeout_seconds, idempotency_key, input, metadata, run_at,
                       created_at, updated_at, replayed_from_task_id, replayed_from_dead_letter_id)
    VALUES (%(id)s, %(task_name)s, %(queue)s, 'PENDING', %(priority)s, %(max_retries)s, 0,
            %(timeout_seconds)s, %(idempotency_key)s, %(input)s, %(metadata)s,
            COALESCE(%(run_at)s, now()), now(), now(), %(replayed_from_task_id)s,
            %(replayed_from_dead_letter_id)s)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
)
SELECT ins.*, (SELECT count(*) FROM (SELECT pg_notify('{TASK_READY}', ins.queue)
                                    WHERE ins.run_at <= now()) n) AS notified
FROM ins
"""

# -- The task that holds an idempotency key (after a conflict). --
SELECT_BY_IDEMPOTENCY_KEY = "SELECT * FROM tasks WHERE idempotency_key = %(idempotency_key)s"
