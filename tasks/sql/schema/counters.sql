-- Durable throughput counters for /metrics and the dashboard's per-minute chart: task_counters
-- (the table itself is created by migration 0005) and the fold that keeps it small.
--
-- The tasks table's statement-level triggers (task_triggers.sql) add up what each statement
-- did (tasks created, and tasks that moved into COMPLETED, FAILED, RETRY, DEAD_LETTER or
-- CANCELLED) and UPSERT one row per (minute, queue, kind) of that statement. A
-- batch of a thousand completions is one UPSERT, not a thousand.
--
-- The row is also keyed by the backend's pid: an UPSERT holds its row lock until
-- the writer commits, and a producer may enqueue inside a long transaction of its
-- own, so a shared row would make every other writer of that queue wait for it.
-- One backend runs one transaction at a time, so with the pid in the key no two
-- transactions ever touch the same counter row: no waits, no deadlocks.
--
-- valka_task_counters_fold() folds minutes older than `keep` into one row per
-- (queue, kind) at minute '-infinity', so the table stays small; the scheduler's
-- retention loop calls it, so that /metrics and the overview only read.

-- Rows a writer still holds (a very long transaction) are skipped and folded next time.
-- The advisory lock makes a concurrent fold a no-op instead of a wait.
CREATE OR REPLACE FUNCTION valka_task_counters_fold(keep interval DEFAULT '2 hours') RETURNS bigint AS $$
DECLARE folded bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('valka_task_counters_fold')) THEN
        RETURN 0;
    END IF;
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
    RETURN folded;
END $$ LANGUAGE plpgsql;
