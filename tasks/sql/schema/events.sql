-- Task events: every new task and every status change announced with NOTIFY on `valka_task_event`
-- by the tasks table's triggers (task_triggers.sql), and the watcher functions here that let them
-- skip the work while nobody listens (the table task_event_watchers is created by migration 0011).
--
-- The triggers are statement-level: the events of one statement (a batch of a thousand
-- completions) travel together as JSON arrays of at most 8 kB each, in the same transaction as the
-- change itself, so the dispatcher's hot path pays no extra round trip and a rolled-back change
-- announces nothing. Subscribers (SSE, gRPC SubscribeEvents, the admin) share one LISTEN
-- connection per process (tasks/live.py).
--
-- Events are built and sent only while someone watches them. Building a statement's events (a
-- JSON object per task) and queueing its NOTIFYs cost about a third of PostgreSQL's work in a
-- drain, and of a batch insert. Most of the time nobody has a live view open, so the triggers
-- first look for a watcher (one probe of a tiny table).
--
-- A NOTIFY payload must stay under 8,000 bytes, or the whole statement fails. One event is at
-- most 3,900 bytes: its error message (the first 500 characters) is left out when it would make
-- the event longer, and without it an event holds at most about 3,650 (names of 255 characters,
-- each character escaped to 6 bytes at worst). A chunk is the events that start within the same
-- 4,000 bytes of the statement's events (counting the comma after each): at most 4,000 bytes of
-- events begin in it and the last is at most 3,901 long, so a chunk's array is under 7,902 bytes.
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
