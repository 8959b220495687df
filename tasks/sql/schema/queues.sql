-- Queue rows and the wake-ups their limits need (the table `queues` is created by migration 0019;
-- docs/queues.md says what its settings do).
--
-- A queue gets its row when its first task or worker appears: the tasks table's INSERT trigger
-- (task_triggers.sql: one probe of the small queues table per distinct queue of the statement,
-- nothing per task), and the dispatcher's hello. A queue without a row behaves as one with no limits, so a
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

-- A slot of a queue with max_running or max_running_per_key is free once its task has left
-- DISPATCHING or RUNNING, committed: the tasks table's UPDATE trigger (task_triggers.sql) then
-- sends NOTIFY valka_queue_slot_freed, which wakes the dispatchers whose claims the limit held back.
