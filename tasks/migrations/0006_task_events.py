from django.db import migrations

# Every status change (and every new task) becomes a TaskEvent announced with
# NOTIFY on `valka_task_event`. The triggers are statement-level: the events of
# one statement (a batch of a thousand completions) travel together as JSON
# arrays of about 5 kB each, in the same transaction as the change itself,
# so the dispatcher's hot path pays no extra round trip and a rolled-back
# change announces nothing. Subscribers (SSE, gRPC SubscribeEvents, the admin)
# share one LISTEN connection per process.
EVENTS = r"""
-- One statement's events as JSON arrays, a NOTIFY per ~5 kB (payloads must stay under 8 kB),
-- built set-based: no per-row function calls or loops.
CREATE FUNCTION valka_task_events_on_insert() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('valka_task_event', '[' || string_agg(ev, ',' ORDER BY id) || ']')
    FROM (
        SELECT id, ev, (sum(octet_length(ev)) OVER (ORDER BY id) / 5000)::int AS chunk
        FROM (
            SELECT n.id, json_build_object(
                'event_id', gen_random_uuid(), 'task_id', n.id, 'queue_name', n.queue,
                'previous_status', NULL, 'new_status', n.status, 'worker_id', '',
                'node_id', COALESCE(n.claimed_by, ''), 'attempt_number', n.attempt_count,
                'error_message', left(COALESCE(n.error_message, ''), 500),
                'timestamp_ms', (extract(epoch FROM statement_timestamp()) * 1000)::bigint)::text AS ev
            FROM new_rows n
        ) events
    ) chunked
    GROUP BY chunk;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

-- The worker is the one of the task's current attempt (its run row, which the same statement
-- may have written).
CREATE FUNCTION valka_task_events_on_update() RETURNS trigger AS $$
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

CREATE TRIGGER tasks_events_insert AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION valka_task_events_on_insert();

CREATE TRIGGER tasks_events_update AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION valka_task_events_on_update();
"""

DROP = """
DROP TRIGGER IF EXISTS tasks_events_update ON tasks;
DROP TRIGGER IF EXISTS tasks_events_insert ON tasks;
DROP FUNCTION IF EXISTS valka_task_events_on_update();
DROP FUNCTION IF EXISTS valka_task_events_on_insert();
"""


class Migration(migrations.Migration):
    dependencies = [("tasks", "0005_dashboard_counters")]

    operations = [migrations.RunSQL(EVENTS, reverse_sql=DROP)]
