-- The tasks table's triggers: one per statement and kind of change, doing the work of three
-- concerns in one call.
--
-- - Counters (counters.sql): tasks created, and tasks that moved into COMPLETED, FAILED, RETRY,
--   DEAD_LETTER or CANCELLED, appended per statement to task_counter_deltas.
-- - Queue rows (queues.sql): a new task's queue gets its row; a task that ends wakes the claims
--   a running limit of its queue held back.
-- - Events (events.sql): every new task and status change, announced while someone watches.
--
-- One trigger rather than one per concern: every trigger call has a cost of its own (the
-- function's frame, its transition tables handed over, its first statement), and three calls per
-- INSERT took about a quarter of what PostgreSQL spends on a single enqueue; one call doing their
-- work costs less than any two of them. Both run after the statement, on its transition tables,
-- so a batch of a thousand completions is one call, as one task is; and both run for statements
-- that change no row (a claim that finds nothing), so what such a statement meets first is one
-- cheap test.

-- ---------------------------------------------------------------- new tasks

CREATE OR REPLACE FUNCTION valka_tasks_inserted() RETURNS trigger AS $$
DECLARE missing text[];
BEGIN
    -- Counters: one row appended per queue of the statement (counters.sql). Its answer names the
    -- statement's queues, which are then probed for their rows in the same statement: one probe
    -- per distinct queue, nothing more while every queue has its row (valka_queues_ensure never
    -- waits).
    WITH counted AS (
        INSERT INTO task_counter_deltas (minute, queue, kind, n)
        SELECT date_trunc('minute', statement_timestamp()), queue, 'created', count(*)
        FROM new_rows GROUP BY queue
        RETURNING queue
    )
    SELECT array_agg(counted.queue) INTO missing FROM counted
    WHERE NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = counted.queue);
    IF missing IS NOT NULL THEN
        PERFORM valka_queues_ensure(missing);
    END IF;

    -- Events, while someone watches (events.sql): the statement's events as JSON arrays, NOTIFYed in
    -- chunks, built set-based. A new task's event carries the statement's time.
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

CREATE OR REPLACE TRIGGER tasks_inserted AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION valka_tasks_inserted();

-- ---------------------------------------------------------------- changed tasks
--
-- The old status of each task comes from old_rows, gathered once into a jsonb object keyed by id
-- and looked up per new row: joined on id, the planner, with no statistics for transition tables
-- and trusting a one-row guess, matched every new row against every old row (a batch of a
-- thousand completions: a million comparisons, inside the dispatcher's write).

CREATE OR REPLACE FUNCTION valka_tasks_updated() RETURNS trigger AS $$
DECLARE previous jsonb;
BEGIN
    -- Claims and starts (most statements) end no task: nothing to count, no slot freed.
    IF EXISTS (SELECT 1 FROM new_rows
               WHERE status IN ('COMPLETED', 'FAILED', 'RETRY', 'DEAD_LETTER', 'CANCELLED')) THEN
        previous := (SELECT jsonb_object_agg(o.id::text, o.status) FROM old_rows o);
        -- Counters: the tasks that moved into an ending status, one row appended per queue and kind.
        INSERT INTO task_counter_deltas (minute, queue, kind, n)
        SELECT date_trunc('minute', statement_timestamp()), n.queue,
               CASE n.status WHEN 'COMPLETED' THEN 'completed' WHEN 'FAILED' THEN 'failed'
                             WHEN 'RETRY' THEN 'retried' WHEN 'DEAD_LETTER' THEN 'dead_lettered'
                             ELSE 'cancelled' END AS kind,
               count(*)
        FROM new_rows n
        WHERE n.status IN ('COMPLETED', 'FAILED', 'RETRY', 'DEAD_LETTER', 'CANCELLED')
          AND n.status IS DISTINCT FROM previous ->> n.id::text
        GROUP BY n.queue, kind;
        -- Freed slots (queues.sql): a slot of a queue with max_running or max_running_per_key is free
        -- once its task has left DISPATCHING or RUNNING, committed. One NOTIFY on
        -- valka_queue_slot_freed (tasks/notify.py) per such queue and statement, sent at its commit,
        -- wakes the dispatchers whose claims the limit held back, whichever node ran the task.
        PERFORM pg_notify('valka_queue_slot_freed', q.name)
        FROM queues q
        WHERE q.name IN (SELECT DISTINCT queue FROM new_rows
                         WHERE status IN ('COMPLETED', 'FAILED', 'RETRY', 'DEAD_LETTER', 'CANCELLED'))
          AND (q.max_running IS NOT NULL OR q.max_running_per_key IS NOT NULL);
    END IF;

    -- Events, while someone watches (events.sql). The worker is the one of the task's current
    -- attempt (its run row, which the same statement may have written); a change's event carries
    -- the clock's time.
    IF NOT EXISTS (SELECT FROM task_event_watchers) THEN RETURN NULL; END IF;
    IF previous IS NULL THEN
        previous := (SELECT jsonb_object_agg(o.id::text, o.status) FROM old_rows o);
    END IF;
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

CREATE OR REPLACE TRIGGER tasks_updated AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION valka_tasks_updated();
