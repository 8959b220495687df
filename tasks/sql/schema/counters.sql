-- Durable throughput counters for /metrics and the dashboard's per-minute chart: task_counters
-- and task_counter_deltas (the tables themselves are created by migrations 0005 and 0023), and
-- the fold that adds the second into the first and keeps the first small.
--
-- The tasks table's statement-level triggers (task_triggers.sql) add up what each statement
-- did (tasks created, and tasks that moved into COMPLETED, FAILED, RETRY, DEAD_LETTER or
-- CANCELLED) and append one row per (minute, queue, kind) of that statement to
-- task_counter_deltas, in the statement's transaction. A batch of a thousand completions is one
-- row, not a thousand.
--
-- Appended, not UPSERTed into one row per minute: a plain insert into a table without an index
-- takes no lock and meets no other writer, where an UPSERT probed the key, locked the row (a WAL
-- record of its own) and wrote a new version of it. On a single task's enqueue that was about
-- 30 µs of the 500 a durable INSERT + NOTIFY + commit costs (docs/performance.md).
--
-- valka_task_counters_fold() moves the deltas into task_counters, one row per (minute, queue,
-- kind) at shard 0, and folds minutes older than `keep` into one row per (queue, kind) at minute
-- '-infinity', so both tables stay small; the scheduler's counter fold loop calls it every few
-- seconds (tasks/scheduler/counters.py), so that /metrics and the overview only read. They read
-- both tables (tasks/sql/dashboard.py), so a count is there from the commit of its statement.
--
-- Other writers of task_counters (the dispatcher's counts of claims a limit held back) UPSERT
-- rows keyed by their backend's pid: one backend runs one transaction at a time, so no two
-- transactions ever touch the same counter row: no waits, no deadlocks.

-- Deltas a writer has not committed yet are invisible here and moved next time; counter rows a
-- writer still holds (a very long transaction) are skipped and folded next time. The advisory
-- lock makes a concurrent fold a no-op instead of a wait.
CREATE OR REPLACE FUNCTION valka_task_counters_fold(keep interval DEFAULT '2 hours') RETURNS bigint AS $$
DECLARE moved bigint; folded bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('valka_task_counters_fold')) THEN
        RETURN 0;
    END IF;
    WITH appended AS (
        DELETE FROM task_counter_deltas RETURNING minute, queue, kind, n
    )
    INSERT INTO task_counters AS c (minute, queue, kind, shard, n)
    SELECT minute, queue, kind, 0, sum(n) FROM appended GROUP BY minute, queue, kind ORDER BY minute, queue, kind
    ON CONFLICT (minute, queue, kind, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    GET DIAGNOSTICS moved = ROW_COUNT;
    WITH old AS (
        DELETE FROM task_counters WHERE ctid IN (
            SELECT ctid FROM task_counters
            WHERE minute > '-infinity' AND minute < date_trunc('minute', now()) - keep
            FOR UPDATE SKIP LOCKED)
        RETURNING queue, kind, n
    )
    INSERT INTO task_counters AS c (minute, queue, kind, shard, n)
    SELECT '-infinity', queue, kind, 0, sum(n) FROM old GROUP BY queue, kind ORDER BY queue, kind
    ON CONFLICT (minute, queue, kind, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    GET DIAGNOSTICS folded = ROW_COUNT;
    RETURN moved + folded;
END $$ LANGUAGE plpgsql;
