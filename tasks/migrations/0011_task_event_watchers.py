from django.db import migrations

# Task events are built and sent only while someone watches them. Building a statement's
# events (a JSON object per task) and queueing its NOTIFYs cost about a third of
# PostgreSQL's work in a drain, and of a batch insert. Most of the time nobody has a live
# view open, so the event triggers first look for a watcher.
#
# A watcher is a session holding LISTEN valka_task_event (a process's fanout, which SSE
# clients and gRPC SubscribeEvents streams share): it calls valka_task_events_watch() on
# its LISTEN connection before it reports itself ready, and removes itself when it stops.
# A watcher that dies without saying so leaves a row behind; that only means events are
# sent for nobody until valka_task_event_watchers_prune() (run by every new watcher and by
# the scheduler's worker janitor) removes rows whose session is gone. A session is matched
# by pid and start time, so a reused pid does not keep a dead watcher alive. A session of
# another role shows no start time in pg_stat_activity; its row is kept while its pid lives.
WATCH = r"""
CREATE TABLE task_event_watchers (
    pid integer NOT NULL,
    backend_start timestamptz NOT NULL,
    PRIMARY KEY (pid, backend_start)
);

CREATE FUNCTION valka_task_event_watchers_prune() RETURNS bigint AS $$
    WITH gone AS (
        DELETE FROM task_event_watchers w
        WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                          WHERE a.pid = w.pid AND (a.backend_start = w.backend_start OR a.backend_start IS NULL))
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$ LANGUAGE sql;

CREATE FUNCTION valka_task_events_watch() RETURNS void AS $$
    SELECT valka_task_event_watchers_prune();
    INSERT INTO task_event_watchers (pid, backend_start)
    SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()
    ON CONFLICT DO NOTHING;
$$ LANGUAGE sql;

CREATE FUNCTION valka_task_events_unwatch() RETURNS void AS $$
    DELETE FROM task_event_watchers WHERE pid = pg_backend_pid();
$$ LANGUAGE sql;
"""

UNWATCH = """
DROP FUNCTION IF EXISTS valka_task_events_unwatch();
DROP FUNCTION IF EXISTS valka_task_events_watch();
DROP FUNCTION IF EXISTS valka_task_event_watchers_prune();
DROP TABLE IF EXISTS task_event_watchers;
"""

UNWATCHED = "IF NOT EXISTS (SELECT FROM task_event_watchers) THEN RETURN NULL; END IF;"


def _event(previous: str, worker: str, clock: str) -> str:
    """One task's event as JSON text, from a row `n` of a transition table."""
    return f"""json_build_object(
                'event_id', gen_random_uuid(), 'task_id', n.id, 'queue_name', n.queue,
                'previous_status', {previous}, 'new_status', n.status, 'worker_id', {worker},
                'node_id', COALESCE(n.claimed_by, ''), 'attempt_number', n.attempt_count,
                'error_message', left(COALESCE(n.error_message, ''), 500),
                'timestamp_ms', (extract(epoch FROM {clock}) * 1000)::bigint)::text"""


def _notify(events: str) -> str:
    """PERFORM the NOTIFYs of `events` (rows of id, ev): JSON arrays of about 5 kB each."""
    return f"""PERFORM pg_notify('valka_task_event', '[' || string_agg(ev, ',' ORDER BY id) || ']')
    FROM (
        SELECT id, ev, (sum(octet_length(ev)) OVER (ORDER BY id) / 5000)::int AS chunk
        FROM ({events}) events
    ) chunked
    GROUP BY chunk;"""


def _events(guard: str) -> str:
    new = _event(previous="NULL", worker="''", clock="statement_timestamp()")
    changed = _event(previous="previous ->> n.id::text", worker="COALESCE(r.worker_id, '')",
                     clock="clock_timestamp()")
    inserted = f"SELECT n.id, {new} AS ev FROM new_rows n"
    updated = (f"SELECT n.id, {changed} AS ev FROM new_rows n "
               "LEFT JOIN task_runs r ON r.task_id = n.id AND r.attempt_number = n.attempt_count "
               "WHERE n.status IS DISTINCT FROM previous ->> n.id::text")
    return f"""
CREATE OR REPLACE FUNCTION valka_task_events_on_insert() RETURNS trigger AS $$
BEGIN
    {guard}
    {_notify(inserted)}
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION valka_task_events_on_update() RETURNS trigger AS $$
DECLARE previous jsonb;
BEGIN
    {guard}
    previous := (SELECT jsonb_object_agg(o.id::text, o.status) FROM old_rows o);
    {_notify(updated)}
    RETURN NULL;
END $$ LANGUAGE plpgsql;
"""


class Migration(migrations.Migration):
    dependencies = [("tasks", "0010_claim_by_queue_status_index")]
    operations = [
        migrations.RunSQL(WATCH, reverse_sql=UNWATCH),
        migrations.RunSQL(_events(UNWATCHED), reverse_sql=_events("")),
    ]
