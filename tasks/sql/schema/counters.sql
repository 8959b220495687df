-- Durable throughput counters for /metrics and the dashboard's per-minute chart: the triggers that
-- keep task_counters (the table itself is created by migration 0005) and the fold that keeps it small.
--
-- Two statement-level triggers on `tasks` add up what each statement did (tasks
-- created, and tasks that moved into COMPLETED, FAILED, RETRY, DEAD_LETTER or
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

CREATE OR REPLACE FUNCTION valka_count_task_inserts() RETURNS trigger AS $$
BEGIN
    INSERT INTO task_counters AS c (minute, queue, kind, shard, n)
    SELECT date_trunc('minute', statement_timestamp()), queue, 'created', pg_backend_pid(), count(*)
    FROM new_rows GROUP BY queue ORDER BY queue
    ON CONFLICT (minute, queue, kind, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

-- An UPDATE's trigger pairs each new row with its old row to know the status it came from.
-- Joined on id, the planner has no statistics for transition tables and, trusting a one-row
-- guess, matched every new row against every old row (a batch of a thousand completions: a
-- million comparisons, inside the dispatcher's write). The old statuses are gathered once into
-- a jsonb object keyed by id and looked up per new row.
CREATE OR REPLACE FUNCTION valka_count_task_transitions() RETURNS trigger AS $$
DECLARE previous jsonb;
BEGIN
    -- Claims and starts (most statements) finish nothing: nothing to count, nothing to look up.
    IF NOT EXISTS (SELECT 1 FROM new_rows
                   WHERE status IN ('COMPLETED', 'FAILED', 'RETRY', 'DEAD_LETTER', 'CANCELLED')) THEN
        RETURN NULL;
    END IF;
    previous := (SELECT jsonb_object_agg(o.id::text, o.status) FROM old_rows o);
    INSERT INTO task_counters AS c (minute, queue, kind, shard, n)
    SELECT date_trunc('minute', statement_timestamp()), n.queue,
           CASE n.status WHEN 'COMPLETED' THEN 'completed' WHEN 'FAILED' THEN 'failed'
                         WHEN 'RETRY' THEN 'retried' WHEN 'DEAD_LETTER' THEN 'dead_lettered'
                         ELSE 'cancelled' END AS kind,
           pg_backend_pid(), count(*)
    FROM new_rows n
    WHERE n.status IN ('COMPLETED', 'FAILED', 'RETRY', 'DEAD_LETTER', 'CANCELLED')
      AND n.status IS DISTINCT FROM previous ->> n.id::text
    GROUP BY n.queue, kind ORDER BY n.queue, kind
    ON CONFLICT (minute, queue, kind, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE TRIGGER tasks_count_inserts AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION valka_count_task_inserts();

CREATE OR REPLACE TRIGGER tasks_count_transitions AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION valka_count_task_transitions();

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
