from django.db import migrations

# The statement triggers on UPDATE of tasks pair each new row with its old row to know the
# status it came from. Joined on id, the planner has no statistics for transition tables and,
# trusting a one-row guess, matched every new row against every old row (a batch of a thousand
# completions: a million comparisons, inside the dispatcher's write). The old statuses are now
# gathered once into a jsonb object keyed by id and looked up per new row.
PREVIOUS = "(SELECT jsonb_object_agg(o.id::text, o.status) FROM old_rows o)"

FORWARD = rf"""
CREATE OR REPLACE FUNCTION valka_task_events_on_update() RETURNS trigger AS $$
DECLARE previous jsonb := {PREVIOUS};
BEGIN
    PERFORM pg_notify('valka_task_event', '[' || string_agg(ev, ',' ORDER BY id) || ']')
    FROM (
        SELECT id, ev, (sum(octet_length(ev)) OVER (ORDER BY id) / 5000)::int AS chunk
        FROM (
            SELECT n.id, json_build_object(
                'event_id', gen_random_uuid(), 'task_id', n.id, 'queue_name', n.queue,
                'previous_status', previous ->> n.id::text, 'new_status', n.status,
                'worker_id', COALESCE(r.worker_id, ''), 'node_id', COALESCE(n.claimed_by, ''),
                'attempt_number', n.attempt_count, 'error_message', left(COALESCE(n.error_message, ''), 500),
                'timestamp_ms', (extract(epoch FROM clock_timestamp()) * 1000)::bigint)::text AS ev
            FROM new_rows n
            LEFT JOIN task_runs r ON r.task_id = n.id AND r.attempt_number = n.attempt_count
            WHERE n.status IS DISTINCT FROM previous ->> n.id::text
        ) events
    ) chunked
    GROUP BY chunk;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION valka_count_task_transitions() RETURNS trigger AS $$
DECLARE previous jsonb;
BEGIN
    -- Claims and starts (most statements) finish nothing: nothing to count, nothing to look up.
    IF NOT EXISTS (SELECT 1 FROM new_rows
                   WHERE status IN ('COMPLETED', 'FAILED', 'RETRY', 'DEAD_LETTER', 'CANCELLED')) THEN
        RETURN NULL;
    END IF;
    previous := {PREVIOUS};
    INSERT INTO task_counters AS c (minute, queue, kind, shard, n)
    SELECT date_trunc('minute', statement_timestamp()), n.queue,
           CASE n.status WHEN 'COMPLETED' THEN 'completed' WHEN 'FAILED' THEN 'failed'
                         WHEN 'RETRY' THEN 'retried' WHEN 'DEAD_LETTER' THEN 'dead_lettered'
                         ELSE 'cancelled' END AS kind,
           pg_backend_pid(), count(*)
    FROM new_rows n
    WHERE n.status IN ('COMPLETED', 'FAILED', 'RETRY', 'DEAD_LETTER', 'CANCELLED')
      AND n.status IS DISTINCT FROM previous ->> n.id::text
    GROUP BY n.queue, kind ORDER BY n.queue, kind
    ON CONFLICT (minute, queue, kind, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
"""

BACKWARD = r"""
CREATE OR REPLACE FUNCTION valka_task_events_on_update() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('valka_task_event', '[' || string_agg(ev, ',' ORDER BY id) || ']')
    FROM (
        SELECT id, ev, (sum(octet_length(ev)) OVER (ORDER BY id) / 5000)::int AS chunk
        FROM (
            SELECT n.id, json_build_object(
                'event_id', gen_random_uuid(), 'task_id', n.id, 'queue_name', n.queue,
                'previous_status', o.status, 'new_status', n.status,
                'worker_id', COALESCE(r.worker_id, ''), 'node_id', COALESCE(n.claimed_by, ''),
                'attempt_number', n.attempt_count, 'error_message', left(COALESCE(n.error_message, ''), 500),
                'timestamp_ms', (extract(epoch FROM clock_timestamp()) * 1000)::bigint)::text AS ev
            FROM new_rows n
            JOIN old_rows o ON o.id = n.id
            LEFT JOIN task_runs r ON r.task_id = n.id AND r.attempt_number = n.attempt_count
            WHERE n.status IS DISTINCT FROM o.status
        ) events
    ) chunked
    GROUP BY chunk;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION valka_count_task_transitions() RETURNS trigger AS $$
BEGIN
    INSERT INTO task_counters AS c (minute, queue, kind, shard, n)
    SELECT date_trunc('minute', statement_timestamp()), n.queue,
           CASE n.status WHEN 'COMPLETED' THEN 'completed' WHEN 'FAILED' THEN 'failed'
                         WHEN 'RETRY' THEN 'retried' WHEN 'DEAD_LETTER' THEN 'dead_lettered'
                         ELSE 'cancelled' END AS kind,
           pg_backend_pid(), count(*)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.status IS DISTINCT FROM o.status
      AND n.status IN ('COMPLETED', 'FAILED', 'RETRY', 'DEAD_LETTER', 'CANCELLED')
    GROUP BY n.queue, kind ORDER BY n.queue, kind
    ON CONFLICT (minute, queue, kind, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
"""


class Migration(migrations.Migration):
    dependencies = [("tasks", "0008_claim_ordered_queue_status_index")]
    operations = [migrations.RunSQL(FORWARD, reverse_sql=BACKWARD)]
