from django.db import migrations

# Every status change (and every new task) becomes a TaskEvent announced with
# NOTIFY on `valka_task_event`. The triggers are statement-level: the events of
# one statement (a batch of a thousand completions) travel together as JSON
# arrays of at most ~7 kB each, in the same transaction as the change itself,
# so the dispatcher's hot path pays no extra round trip and a rolled-back
# change announces nothing. Subscribers (SSE, gRPC SubscribeEvents, the admin)
# share one LISTEN connection per process.
EVENTS = r"""
CREATE FUNCTION valka_announce_events(events jsonb[]) RETURNS void AS $$
DECLARE
    chunk text := '';
    item jsonb;
BEGIN
    IF COALESCE(cardinality(events), 0) = 0 THEN
        RETURN;
    END IF;
    FOREACH item IN ARRAY events LOOP
        IF length(chunk) + length(item::text) > 7000 AND chunk <> '' THEN
            PERFORM pg_notify('valka_task_event', '[' || chunk || ']');
            chunk := '';
        END IF;
        chunk := CASE WHEN chunk = '' THEN item::text ELSE chunk || ',' || item::text END;
    END LOOP;
    IF chunk <> '' THEN
        PERFORM pg_notify('valka_task_event', '[' || chunk || ']');
    END IF;
END $$ LANGUAGE plpgsql;

-- Arguments: task id, queue, previous status, new status, attempt, node, error. The worker is
-- the one of the task's current attempt (its run row, written by the same statement).
CREATE FUNCTION valka_task_event_row(uuid, text, text, text, integer, text, text) RETURNS jsonb AS $$
    SELECT jsonb_build_object(
        'event_id', valka_uuid7(), 'task_id', $1, 'queue_name', $2, 'previous_status', $3,
        'new_status', $4, 'worker_id', COALESCE((SELECT r.worker_id FROM task_runs r
                                                 WHERE r.task_id = $1 AND r.attempt_number = $5), ''),
        'node_id', COALESCE($6, ''), 'attempt_number', $5, 'error_message', left(COALESCE($7, ''), 500),
        'timestamp_ms', (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
$$ LANGUAGE sql VOLATILE;

CREATE FUNCTION valka_task_events_on_insert() RETURNS trigger AS $$
BEGIN
    PERFORM valka_announce_events(ARRAY(
        SELECT valka_task_event_row(n.id, n.queue, NULL, n.status, n.attempt_count, n.claimed_by,
                                    n.error_message)
        FROM new_rows n ORDER BY n.id));
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE FUNCTION valka_task_events_on_update() RETURNS trigger AS $$
BEGIN
    PERFORM valka_announce_events(ARRAY(
        SELECT valka_task_event_row(n.id, n.queue, o.status, n.status, n.attempt_count, n.claimed_by,
                                    n.error_message)
        FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.status IS DISTINCT FROM o.status ORDER BY n.id));
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
DROP FUNCTION IF EXISTS valka_task_event_row(uuid, text, text, text, integer, text, text);
DROP FUNCTION IF EXISTS valka_announce_events(jsonb[]);
"""


class Migration(migrations.Migration):
    dependencies = [("tasks", "0005_dashboard_counters")]

    operations = [migrations.RunSQL(EVENTS, reverse_sql=DROP)]
