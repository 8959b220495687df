from django.db import migrations

# Durable throughput counters for /metrics and the dashboard's per-minute chart.
#
# Two statement-level triggers on `tasks` add up what each statement did (tasks
# created, and tasks that moved into COMPLETED, FAILED, RETRY, DEAD_LETTER or
# CANCELLED) and UPSERT one row per (minute, queue, kind) of that statement. A
# batch of a thousand completions is one UPSERT, not a thousand.
#
# The row is also keyed by the backend's pid: an UPSERT holds its row lock until
# the writer commits, and a producer may enqueue inside a long transaction of its
# own, so a shared row would make every other writer of that queue wait for it.
# One backend runs one transaction at a time, so with the pid in the key no two
# transactions ever touch the same counter row: no waits, no deadlocks.
#
# valka_task_counters_fold() folds minutes older than `keep` into one row per
# (queue, kind) at minute '-infinity', so the table stays small; /metrics and the
# overview call it before they read (one index probe when there is nothing to fold).
COUNTERS = """
CREATE TABLE task_counters (
    minute timestamptz NOT NULL,
    queue text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('created', 'completed', 'failed', 'retried', 'dead_lettered', 'cancelled')),
    shard integer NOT NULL,
    n bigint NOT NULL,
    PRIMARY KEY (minute, queue, kind, shard)
);

CREATE FUNCTION valka_count_task_inserts() RETURNS trigger AS $$
BEGIN
    INSERT INTO task_counters AS c (minute, queue, kind, shard, n)
    SELECT date_trunc('minute', statement_timestamp()), queue, 'created', pg_backend_pid(), count(*)
    FROM new_rows GROUP BY queue ORDER BY queue
    ON CONFLICT (minute, queue, kind, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE FUNCTION valka_count_task_transitions() RETURNS trigger AS $$
BEGIN
    INSERT INTO task_counters AS c (minute, queue, kind, shard, n)
    SELECT date_trunc('minute', statement_timestamp()), n.queue,
           CASE n.status WHEN 'COMPLETED' THEN 'completed' WHEN 'FAILED' THEN 'failed'
                         WHEN 'RETRY' THEN 'retried' WHEN 'DEAD_LETTER' THEN 'dead_lettered'
                         ELSE 'cancelled' END AS kind,
           pg_backend_pid(), count(*)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.status IS DISTINCT FROM o.status
      AND n.status IN ('COMPLETED', 'FAILED', 'RETRY', 'DEAD_LETTER', 'CANCELLED')
    GROUP BY n.queue, kind ORDER BY n.queue, kind
    ON CONFLICT (minute, queue, kind, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER tasks_count_inserts AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION valka_count_task_inserts();

CREATE TRIGGER tasks_count_transitions AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION valka_count_task_transitions();

-- Rows a writer still holds (a very long transaction) are skipped and folded next time.
CREATE FUNCTION valka_task_counters_fold(keep interval DEFAULT '2 hours') RETURNS bigint AS $$
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
"""

DROP_COUNTERS = """
DROP TRIGGER IF EXISTS tasks_count_transitions ON tasks;
DROP TRIGGER IF EXISTS tasks_count_inserts ON tasks;
DROP FUNCTION IF EXISTS valka_task_counters_fold(interval);
DROP FUNCTION IF EXISTS valka_count_task_transitions();
DROP FUNCTION IF EXISTS valka_count_task_inserts();
DROP TABLE IF EXISTS task_counters;
"""


class Migration(migrations.Migration):
    dependencies = [("tasks", "0004_task_delayed_idx")]

    operations = [
        migrations.AlterModelOptions(
            name="task",
            options={
                "ordering": ["-id"],
                "permissions": [("cancel_task", "Can cancel tasks"), ("replay_task", "Can replay finished tasks")],
            },
        ),
        migrations.AlterModelOptions(
            name="deadletter",
            options={"ordering": ["-created_at"], "permissions": [("replay_deadletter", "Can replay dead letters")]},
        ),
        migrations.RunSQL(COUNTERS, reverse_sql=DROP_COUNTERS),
    ]
