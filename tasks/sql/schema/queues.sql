-- Queue rows and the wake-ups their limits need (the table `queues` is created by migration 0019;
-- docs/queues.md says what its settings do).
--
-- A queue gets its row when its first task or worker appears: a statement trigger on the tasks
-- INSERT (one probe of the small queues table per distinct queue of the statement, nothing per
-- task), and the dispatcher's hello. A queue without a row behaves as one with no limits, so a
-- row that is missing for a moment changes nothing.
--
-- valka_queues_ensure() makes the rows that are missing. It never waits: a producer that enqueued
-- the first task of a queue inside a long transaction holds that row uncommitted, and an INSERT
-- ... ON CONFLICT of another session would wait for it to end. So a session first takes a
-- transaction-level advisory lock on the name, without waiting; one that cannot get it leaves the
-- row to the session that holds it (or, if that one rolls back, to the next task or hello).

CREATE OR REPLACE FUNCTION valka_queues_ensure(names text[]) RETURNS void AS $$
BEGIN
    -- PL/pgSQL, not SQL: a SQL function's statements are planned again at every call, which cost
    -- more than the rest of an enqueue. Most calls find every row there and stop at this probe.
    IF NOT EXISTS (SELECT 1 FROM unnest(names) AS n(name)
                   WHERE n.name IS NOT NULL AND NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = n.name)) THEN
        RETURN;
    END IF;
    INSERT INTO queues (name)
    SELECT missing.name FROM (
        SELECT DISTINCT n.name FROM unnest(names) AS n(name)
        WHERE n.name IS NOT NULL AND NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = n.name)
        OFFSET 0  -- every name is looked up before any lock is tried
    ) missing
    WHERE pg_try_advisory_xact_lock(hashtext('valka_queues_ensure'), hashtext(missing.name))
    ORDER BY missing.name
    ON CONFLICT DO NOTHING;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION valka_queues_of_new_tasks() RETURNS trigger AS $$
BEGIN
    -- One probe per distinct queue, in one query: nothing more while every queue has its row.
    IF EXISTS (SELECT 1 FROM (SELECT DISTINCT queue FROM new_rows) n
               WHERE NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = n.queue)) THEN
        PERFORM valka_queues_ensure(ARRAY(SELECT DISTINCT queue FROM new_rows));
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE TRIGGER tasks_queue_rows AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION valka_queues_of_new_tasks();

-- A slot of a queue with max_running or max_running_per_key is free once its task has left
-- DISPATCHING or RUNNING, committed: then the dispatchers whose claims the limit held back may
-- claim again, whichever node ran the task. One NOTIFY on valka_queue_slot_freed (tasks/notify.py)
-- per such queue and statement, sent at its commit; nothing for a queue without those limits
-- beyond one probe of its row, and nothing at all for the statements that end no task (claims,
-- starts).
CREATE OR REPLACE FUNCTION valka_queue_slots_freed() RETURNS trigger AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_rows
                   WHERE status IN ('COMPLETED', 'FAILED', 'RETRY', 'DEAD_LETTER', 'CANCELLED')) THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('valka_queue_slot_freed', q.name)
    FROM queues q
    WHERE q.name IN (SELECT DISTINCT queue FROM new_rows
                     WHERE status IN ('COMPLETED', 'FAILED', 'RETRY', 'DEAD_LETTER', 'CANCELLED'))
      AND (q.max_running IS NOT NULL OR q.max_running_per_key IS NOT NULL);
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE TRIGGER tasks_queue_slots_freed AFTER UPDATE ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION valka_queue_slots_freed();
