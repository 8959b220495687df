"""The scheduler's statements: leader election, retry, reap, promote, janitor, retention.

Every statement works on a bounded batch (`%(limit)s`) picked with
`FOR UPDATE SKIP LOCKED`, then reached by its physical address (`ctid =
ANY(...)`, a TID scan; a locked row cannot move): joined to the pick, the
planner, on stale statistics, may rescan a whole index per picked row. A
row another transaction holds (a dispatcher writing a result, a cancel,
another scheduler) is skipped this pass and looked at again on the next, so
the scheduler never waits on the hot path and never overrules it. Status
changes are the state machine's guarded updates. `%(now)s` may be NULL (the
database clock) or an explicit time, so tests move time without sleeping.
"""

from tasks.notify import TASK_READY
from tasks.sql.queues import QUEUES
from tasks.states import FINAL_STATES, TaskStatus, guarded_update

# The reference time of a statement: the caller's, or the database's own clock.
NOW = "COALESCE(%(now)s::timestamptz, now())"

# Since when the database has been writable for everyone, as far as the judge (a scheduler loop)
# knows (tasks.scheduler.base.Loop.watching_since), or NULL: always. Nothing is judged on time
# that passed while the database could not be written: a heartbeat, a lease or a claim whose
# deadline fell in an outage gets, from the outage's end, the time it would have had to be renewed.
SINCE = "COALESCE(%(since)s::timestamptz, '-infinity')"

# -- The database's clock, and when PostgreSQL last started (the end of an outage that stopped it). --
DB_CLOCK = "SELECT now(), pg_postmaster_start_time()"

_RETENTION_FINAL = ", ".join(f"'{s.value}'" for s in sorted(FINAL_STATES - {TaskStatus.DEAD_LETTER}))

# ---------------------------------------------------------------- retry engine

# -- Due RETRY tasks with attempts left → PENDING, earliest first; one NOTIFY per queue, one row per queue. --
# Matches tasks_retry_due_idx (run_at) WHERE status = 'RETRY'.
RETRY_DUE = f"""
WITH picked AS MATERIALIZED (
    SELECT ctid FROM tasks
    WHERE status = 'RETRY' AND run_at <= {NOW} AND attempt_count <= max_retries
    ORDER BY run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), moved AS (
    {guarded_update(TaskStatus.PENDING, sources=[TaskStatus.RETRY],
                    where="ctid = ANY(ARRAY(SELECT ctid FROM picked))", set="claimed_by = NULL", by_address=True,
                    returning="id, queue")}
)
SELECT queue, count(*) AS moved, pg_notify('{TASK_READY}', queue)::text FROM moved GROUP BY queue
"""

# -- RETRY tasks with no attempts left, locked for lifecycle.DEAD_LETTER_TASKS in the same transaction. --
RETRY_EXHAUSTED = """
SELECT id FROM tasks
WHERE status = 'RETRY' AND attempt_count > max_retries
ORDER BY run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
"""

# -- Seconds until the earliest RETRY task is due (negative if overdue, NULL if none). --
NEXT_RETRY_DUE = """
SELECT EXTRACT(EPOCH FROM min(run_at) - now())::float8 FROM tasks WHERE status = 'RETRY'
"""

# ---------------------------------------------------------------- lease reaper

# -- RUNNING runs whose lease has expired, locked with their task for outcomes.retry_runs. --
# Both rows are locked (or the pair skipped), so a heartbeat, a result or a cancel
# that is writing either row right now wins, and one that comes later finds the
# run closed and changes nothing. Matches task_runs_lease_idx WHERE finished_at IS NULL.
# None is judged before the judge has seen the database for %(grace)s seconds (a lease
# extension: the time a live worker's heartbeat takes to renew a lease that ran out meanwhile).
EXPIRED_LEASES = f"""
SELECT r.id FROM task_runs r JOIN tasks t ON t.id = r.task_id
WHERE r.finished_at IS NULL AND r.status = 'RUNNING' AND r.lease_expires_at < {NOW}
  AND {SINCE} + make_interval(secs => %(grace)s) < {NOW}
ORDER BY r.lease_expires_at LIMIT %(limit)s
FOR UPDATE OF r, t SKIP LOCKED
"""

# -- DISPATCHING tasks claimed longer than %(timeout)s ago (their dispatcher died) → PENDING, no attempt counted. --
# Read queue by queue from tasks_queue_status_idx (QUEUES, then each queue's DISPATCHING
# range): there is no index on DISPATCHING alone (see Task.Meta). One NOTIFY per queue.
STUCK_DISPATCHING = f"""
WITH RECURSIVE {QUEUES}, picked AS MATERIALIZED (
    SELECT stuck.ctid FROM queue_names q CROSS JOIN LATERAL (
        SELECT t.ctid FROM tasks t
        WHERE t.queue = q.queue AND t.status = 'DISPATCHING'
          AND t.updated_at < {NOW} - make_interval(secs => %(timeout)s)
          AND {SINCE} < {NOW} - make_interval(secs => %(timeout)s)
        LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    ) stuck
    LIMIT %(limit)s
), moved AS (
    {guarded_update(TaskStatus.PENDING, sources=[TaskStatus.DISPATCHING],
                    where="ctid = ANY(ARRAY(SELECT ctid FROM picked))", set="claimed_by = NULL", by_address=True,
                    returning="id, queue")}
)
SELECT queue, count(*) AS moved, pg_notify('{TASK_READY}', queue)::text FROM moved GROUP BY queue
"""

# ---------------------------------------------------------------- delayed promoter

# The first delayed PENDING task due after {after}: min(run_at) alone, so that the first entry of
# tasks_delayed_idx past it answers (a min over an expression of run_at reads every later task).
_FIRST_DELAYED_AFTER = """
SELECT min(t.run_at) FROM tasks t
WHERE t.status = 'PENDING' AND t.run_at > t.created_at AND t.run_at > {after}
"""

# -- Delayed PENDING tasks that fell due in (%(since)s, now]: count them and NOTIFY once per queue. --
# Always returns the reference time in its first row (queue NULL when nothing fell due), which
# becomes the next pass's %(since)s, and in every row the seconds from it until the next delayed
# task falls due (NULL if none), as NEXT_DELAYED_DUE would answer: the pass's sleep, without a
# statement of its own. Matches tasks_delayed_idx. Nothing is moved or locked.
DUE_DELAYED = f"""
WITH clock AS MATERIALIZED (SELECT {NOW} AS now),
due AS (
    SELECT t.queue, count(*) AS n FROM tasks t, clock
    WHERE t.status = 'PENDING' AND t.run_at > t.created_at
      AND t.run_at > COALESCE(%(since)s::timestamptz, clock.now - make_interval(secs => %(lookback)s))
      AND t.run_at <= clock.now
    GROUP BY t.queue
), next AS MATERIALIZED (
    SELECT EXTRACT(EPOCH FROM ({_FIRST_DELAYED_AFTER.format(after="(SELECT now FROM clock)")}) - clock.now)::float8
           AS seconds
    FROM clock
)
SELECT clock.now, due.queue, COALESCE(due.n, 0),
       CASE WHEN due.queue IS NOT NULL THEN pg_notify('{TASK_READY}', due.queue)::text END,
       next.seconds
FROM clock CROSS JOIN next LEFT JOIN due ON true
"""

# -- Seconds until the next delayed PENDING task falls due (NULL if none). --
NEXT_DELAYED_DUE = f"""
SELECT EXTRACT(EPOCH FROM ({_FIRST_DELAYED_AFTER.format(after="now()")}) - now())::float8
"""

# ---------------------------------------------------------------- worker janitor

# -- CONNECTED workers not heard from for %(timeout)s → DISCONNECTED. --
# The guard is repeated in the UPDATE: a worker whose dispatcher touched it, or that
# reconnected, after the pick is not disconnected (and one being touched is skipped).
# Silence is counted only from when the judge could see the database (SINCE).
STALE_WORKERS = f"""
WITH picked AS (
    SELECT id FROM workers
    WHERE status = 'CONNECTED' AND last_heartbeat_at < {NOW} - make_interval(secs => %(timeout)s)
      AND {SINCE} < {NOW} - make_interval(secs => %(timeout)s)
    ORDER BY last_heartbeat_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE workers w SET status = 'DISCONNECTED', disconnected_at = now()
FROM picked
WHERE w.id = picked.id AND w.status = 'CONNECTED'
  AND w.last_heartbeat_at < {NOW} - make_interval(secs => %(timeout)s)
RETURNING w.id
"""

# -- Task event watchers whose session has ended (see tasks/sql/schema/events.sql): until they are gone,
# the event triggers build events nobody reads. --
PRUNE_EVENT_WATCHERS = "SELECT valka_task_event_watchers_prune()"

# -- The RUNNING runs of those workers, locked with their tasks for outcomes.retry_runs. --
# A run skipped here (its row busy) keeps its lease; the lease reaper closes it later.
RUNS_OF_WORKERS = """
SELECT r.id, r.worker_id FROM task_runs r JOIN tasks t ON t.id = r.task_id
WHERE r.worker_id = ANY(%(worker_ids)s) AND r.finished_at IS NULL AND r.status = 'RUNNING'
FOR UPDATE OF r, t SKIP LOCKED
"""

# ---------------------------------------------------------------- retention

# -- Finished tasks (COMPLETED, FAILED, CANCELLED) older than %(days)s → deleted, oldest first. --
# Runs, logs and signals go with them by ON DELETE CASCADE; replays and dead letters
# that point at them keep their rows (ON DELETE SET NULL). Matches tasks_finished_idx.
PRUNE_FINISHED = f"""
WITH picked AS MATERIALIZED (
    SELECT ctid FROM tasks
    WHERE status IN ({_RETENTION_FINAL}) AND finished_at < {NOW} - %(days)s * interval '1 day'
    ORDER BY finished_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
DELETE FROM tasks WHERE ctid = ANY(ARRAY(SELECT ctid FROM picked))
RETURNING id
"""

# -- Dead letters older than %(days)s → deleted, with their DEAD_LETTER task. Returns one row per letter. --
PRUNE_DEAD_LETTERS = f"""
WITH picked AS (
    SELECT id FROM dead_letter_queue
    WHERE created_at < {NOW} - %(days)s * interval '1 day'
    ORDER BY created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), letters AS (
    DELETE FROM dead_letter_queue WHERE id = ANY(ARRAY(SELECT id FROM picked)) RETURNING id, task_id
), gone AS (
    DELETE FROM tasks WHERE id = ANY(ARRAY(SELECT task_id FROM letters)) AND status = '{TaskStatus.DEAD_LETTER.value}'
    RETURNING id
)
SELECT letters.id, gone.id FROM letters LEFT JOIN gone ON gone.id = letters.task_id
"""

# -- Workers DISCONNECTED for more than %(days)s → deleted, oldest first (workers_gone_idx). Nothing
# refers to a worker's row (runs keep its id as text), and a worker that comes back with the same
# id says hello and gets a new row. --
PRUNE_WORKERS = f"""
WITH picked AS (
    SELECT id FROM workers
    WHERE status = 'DISCONNECTED' AND disconnected_at < {NOW} - %(days)s * interval '1 day'
    ORDER BY disconnected_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
DELETE FROM workers w USING picked
WHERE w.id = picked.id AND w.status = 'DISCONNECTED'
RETURNING w.id
"""

# -- DEAD_LETTER tasks older than %(days)s whose dead letter was deleted by hand → deleted. --
PRUNE_ORPHAN_DEAD_LETTER_TASKS = f"""
WITH picked AS MATERIALIZED (
    SELECT ctid FROM tasks t
    WHERE status = '{TaskStatus.DEAD_LETTER.value}' AND finished_at < {NOW} - %(days)s * interval '1 day'
      AND NOT EXISTS (SELECT 1 FROM dead_letter_queue d WHERE d.task_id = t.id)
    ORDER BY finished_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
DELETE FROM tasks WHERE ctid = ANY(ARRAY(SELECT ctid FROM picked))
RETURNING id
"""

# -- Move the appended counts into their minutes, and fold minutes older than two hours into one
# -- total row per (queue, kind): the tables behind /metrics and the overview's chart stay small
# -- (tasks/sql/schema/counters.sql). Answers how many counter rows it wrote. --
FOLD_COUNTERS = "SELECT valka_task_counters_fold()"

# ---------------------------------------------------------------- leader election

# -- Take the scheduler's advisory lock for this session, if no other session holds it (a session
# of its own: never through a transaction pooler). --
TRY_LEADER_LOCK = "SELECT pg_try_advisory_lock(%s)"

# -- The leader's lock connection still answers (its session, and so the lock, is alive). --
LEADER_ALIVE = "SELECT 1"
