-- Task events: the triggers that announce every new task and every status change with NOTIFY on
-- `valka_task_event`, and the watcher functions that let them skip the work while nobody listens
-- (the table task_event_watchers is created by migration 0011).
--
-- The triggers are statement-level: the events of one statement (a batch of a thousand
-- completions) travel together as JSON arrays of at most 8 kB each, in the same transaction as the
-- change itself, so the dispatcher's hot path pays no extra round trip and a rolled-back change
-- announces nothing. Subscribers (SSE, gRPC SubscribeEvents, the admin) share one LISTEN
-- connection per process (tasks/live.py).
--
-- Events are built and sent only while someone watches them. Building a statement's events (a
-- JSON object per task) and queueing its NOTIFYs cost about a third of PostgreSQL's work in a
-- drain, and of a batch insert. Most of the time nobody has a live view open, so the event
-- triggers first look for a watcher.
--
-- A watcher is a session holding LISTEN valka_task_event (a process's fanout, which SSE clients
-- and gRPC SubscribeEvents streams share): it calls valka_task_events_watch() on its LISTEN
-- connection before it reports itself ready, and removes itself when it stops. A watcher that
-- dies without saying so leaves a row behind; that only means events are sent for nobody until
-- valka_task_event_watchers_prune() (run by every new watcher and by the scheduler's worker
-- janitor) removes rows whose session is gone. A session is matched by pid and start time, so a
-- reused pid does not keep a dead watcher alive. A session of another role shows no start time
-- in pg_stat_activity; its row is kept while its pid lives.

-- ---------------------------------------------------------------- watchers

CREATE OR REPLACE FUNCTION valka_task_event_watchers_prune() RETURNS bigint AS $$
    WITH gone AS (
        DELETE FROM task_event_watchers w
        WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                          WHERE a.pid = w.pid AND (a.backend_start = w.backend_start OR a.backend_start IS NULL))
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$ LANGUAGE sql;

CREATE OR REPLACE FUNCTION valka_task_events_watch() RETURNS void AS $$
    SELECT valka_task_event_watchers_prune();
    INSERT INTO task_event_watchers (pid, backend_start)
    SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()
    ON CONFLICT DO NOTHING;
$$ LANGUAGE sql;

CREATE OR REPLACE FUNCTION valka_task_events_unwatch() RETURNS void AS $$
    DELETE FROM task_event_watchers WHERE pid = pg_backend_pid();
$$ LANGUAGE sql;

-- ---------------------------------------------------------------- events
--
-- Each trigger first returns when no watcher is registered (the guard: one probe of a tiny table).
-- Then one statement's events as JSON arrays, NOTIFYed in chunks, built set-based: no per-row
-- function calls or loops. A new task's event carries the statement's time; a change's carries
-- the clock's.
--
-- A NOTIFY payload must stay under 8,000 bytes, or the whole statement fails. One event is at
-- most 3,900 bytes: its error message (the first 500 characters) is left out when it would make
-- the event longer, and without it an event holds at most about 3,650 (names of 255 characters,
-- each character escaped to 6 bytes at worst). A chunk is the events that start within the same
-- 4,000 bytes of the statement's events (counting the comma after each): at most 4,000 bytes of
-- events begin in it and the last is at most 3,901 long, so a chunk's array is under 7,902 bytes.

CREATE OR REPLACE FUNCTION valka_task_events_on_insert() RETURNS trigger AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM task_event_watchers) THEN RETURN NULL; END IF;
    PERFORM pg_notify('valka_task_event', '[' || string_agg(ev, ',' ORDER BY id) || ']')
    FROM (
        SELECT id, ev, ((sum(octet_length(ev) + 1) OVER (ORDER BY id) - octet_length(ev) - 1) / 4000)::int AS chunk
        FROM (SELECT n.id, CASE WHEN octet_length(e.ev) <= 3900 THEN e.ev ELSE json_build_object(
                'event_id', gen_random_uuid(), 'task_id', n.id, 'queue_name', n.queue,
                'previous_status', NULL, 'new_status', n.status, 'worker_id', '',
                'node_id', COALESCE(n.claimed_by, ''), 'attempt_number', n.attempt_count,
                'error_message', '',
                'timestamp_ms', (extract(epoch FROM statement_timestamp()) * 1000)::bigint)::text END AS ev
              FROM new_rows n CROSS JOIN LATERAL (SELECT json_build_object(
                'event_id', gen_random_uuid(), 'task_id', n.id, 'queue_name', n.queue,
                'previous_status', NULL, 'new_status', n.status, 'worker_id', '',
                'node_id', COALESCE(n.claimed_by, ''), 'attempt_number', n.attempt_count,
                'error_message', left(COALESCE(n.error_message, ''), 500),
                'timestamp_ms', (extract(epoch FROM statement_timestamp()) * 1000)::bigint)::text AS ev) e) events
    ) chunked
    GROUP BY chunk;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

-- The worker is the one of the task's current attempt (its run row, which the same statement may
-- have written). The old statuses are gathered once into a jsonb object keyed by id and looked up
-- per new row: joined on id, the planner, with no statistics for transition tables, matched every
-- new row against every old row (see valka_count_task_transitions in counters.sql).
CREATE OR REPLACE FUNCTION valka_task_events_on_update() RETURNS trigger AS $$
DECLARE previous jsonb;
BEGIN
    IF NOT EXISTS (SELECT FROM task_event_watchers) THEN RETURN NULL; END IF;
    previous := (SELECT jsonb_object_agg(o.id::text, o.status) FROM old_rows o);
    PERFORM pg_notify('valka_task_event', '[' || string_agg(ev, ',' ORDER BY id) || ']')
    FROM (
        SELECT id, ev, ((sum(octet_length(ev) + 1) OVER (ORDER BY id) - octet_length(ev) - 1) / 4000)::int AS chunk
        FROM (SELECT n.id, CASE WHEN octet_length(e.ev) <= 3900 THEN e.ev ELSE json_build_object(
                'event_id', gen_random_uuid(), 'task_id', n.id, 'queue_name', n.queue,
                'previous_status', previous ->> n.id::text, 'new_status', n.status, 'worker_id', COALESCE(r.worker_id, ''),
                'node_id', COALESCE(n.claimed_by, ''), 'attempt_number', n.attempt_count,
                'error_message', '',
                'timestamp_ms', (extract(epoch FROM clock_timestamp()) * 1000)::bigint)::text END AS ev
              FROM new_rows n LEFT JOIN task_runs r ON r.task_id = n.id AND r.attempt_number = n.attempt_count
              CROSS JOIN LATERAL (SELECT json_build_object(
                'event_id', gen_random_uuid(), 'task_id', n.id, 'queue_name', n.queue,
                'previous_status', previous ->> n.id::text, 'new_status', n.status, 'worker_id', COALESCE(r.worker_id, ''),
                'node_id', COALESCE(n.claimed_by, ''), 'attempt_number', n.attempt_count,
                'error_message', left(COALESCE(n.error_message, ''), 500),
                'timestamp_ms', (extract(epoch FROM clock_timestamp()) * 1000)::bigint)::text AS ev) e
              WHERE n.status IS DISTINCT FROM previous ->> n.id::text) events
    ) chunked
    GROUP BY chunk;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE TRIGGER tasks_events_insert AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION valka_task_events_on_insert();

CREATE OR REPLACE TRIGGER tasks_events_update AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION valka_task_events_on_update();
