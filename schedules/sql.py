"""The schedules' statements: the firing loop's, and the reads of the overview and /metrics.

Firing takes one transaction per batch: DUE_SCHEDULES locks up to a batch of due schedules
(`FOR UPDATE SKIP LOCKED`, so a second scheduler, an edit or a trigger in flight is passed
over, never waited for), the tasks go in with the producer's own `tasks.sql.producer.INSERT_TASKS`
(triggers, NOTIFY and idempotency keys as for any task), and ADVANCE_SCHEDULES moves every
schedule of the batch to its next slot, all before the commit. `%(now)s` may be NULL (the
database clock) or an explicit time, so tests move time without sleeping.
"""

# The channel the schedules table's trigger wakes the firing loop on (schedules/schema/notify.sql).
SCHEDULES_CHANGED = "valka_schedules_changed"

NOW = "COALESCE(%(now)s::timestamptz, now())"

# -- Up to a batch of due schedules, earliest first, locked; rows another transaction holds are skipped. --
# Matches schedules_due_idx (next_run_at) WHERE enabled AND next_run_at IS NOT NULL. `template` is
# the task each slot creates, as JSON text in INSERT_TASKS's shape but for the fields each slot sets
# (id, idempotency_key, run_at): the loop appends those to the text instead of building the JSON.
# The template is built from the locked rows (`due`), after the LIMIT: with the JSON in the scan's
# own output, a plan that sorts the due rows (the statistics of schedules just added promise few)
# built it for every due schedule, not the batch's: 10,000 due at once took four times as long to read.
DUE_SCHEDULES = f"""
WITH due AS MATERIALIZED (
    SELECT id, name, cron, interval_seconds, timezone, catch_up, start_at, end_at, next_run_at,
           task_name, queue, priority, max_retries, timeout_seconds, input, metadata
    FROM schedules
    WHERE enabled AND next_run_at IS NOT NULL AND next_run_at <= {NOW}
    ORDER BY next_run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
SELECT id, name, cron, interval_seconds, timezone, catch_up, start_at, end_at, next_run_at,
       json_build_object('task_name', task_name, 'queue', queue, 'priority', priority,
                         'max_retries', max_retries, 'timeout_seconds', timeout_seconds, 'input', input,
                         'metadata', metadata || jsonb_build_object('valka.schedule', name))::text AS template,
       {NOW} AS now
FROM due
ORDER BY next_run_at
"""

# -- Every schedule of a batch to its next slot, with what it fired, in one statement. --
# Per schedule: its next slot (NULL: none left), the slot of its last new task and that task (NULL:
# it created none this time) and how many slots it fired; the lag is the fire time minus that slot.
ADVANCE_SCHEDULES = f"""
UPDATE schedules AS s
SET next_run_at = u.next_run_at,
    last_run_at = COALESCE(u.slot, s.last_run_at),
    last_task_id = COALESCE(u.task_id, s.last_task_id),
    fired_count = s.fired_count + u.fired,
    last_lag_seconds = COALESCE(EXTRACT(EPOCH FROM {NOW} - u.slot)::float8, s.last_lag_seconds)
FROM unnest(%(ids)s::bigint[], %(next_run_at)s::timestamptz[], %(slots)s::timestamptz[], %(task_ids)s::uuid[],
            %(fired)s::int[]) AS u(id, next_run_at, slot, task_id, fired)
WHERE s.id = u.id
"""

# -- Seconds until the earliest enabled schedule is due (negative if overdue, NULL if none): one index probe. --
NEXT_DUE = """
SELECT EXTRACT(EPOCH FROM min(next_run_at) - now())::float8 FROM schedules
WHERE enabled AND next_run_at IS NOT NULL
"""

# -- A schedule fired by hand: its last task and when, locking its row for the caller's transaction. --
MARK_TRIGGERED = """
UPDATE schedules SET last_task_id = %(task_id)s, last_run_at = %(at)s WHERE id = %(id)s RETURNING id
"""

# -- Enable or disable schedules; next_run_at stays, so re-enabling applies catch_up to what was missed. --
SET_ENABLED = """
UPDATE schedules SET enabled = %(enabled)s, updated_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND enabled IS DISTINCT FROM %(enabled)s
RETURNING name
"""

# -- Serializes the reconciliations of VALKA_SCHEDULES of schedulers that start together (transaction lock). --
RECONCILE_LOCK = "SELECT pg_advisory_xact_lock(%(key)s)"

# -- The next schedules due, with their last task's status (the overview): the due index's first entries. --
NEXT_SCHEDULES = """
SELECT s.id, s.name, s.cron, s.interval_seconds, s.timezone, s.next_run_at, s.last_run_at, t.id, t.status
FROM schedules s LEFT JOIN tasks t ON t.id = s.last_task_id
WHERE s.enabled AND s.next_run_at IS NOT NULL
ORDER BY s.next_run_at
LIMIT %(limit)s
"""

# -- What /metrics says of every schedule: slots fired and the lag of the last one. --
METRICS = "SELECT name, fired_count, last_lag_seconds FROM schedules ORDER BY name"
