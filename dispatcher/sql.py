"""The dispatcher's hot-path statements: claim, start, un-send, heartbeat, logs, workers.

Each runs once per batch, never once per message. Status changes are built by
`tasks.states.guarded_update`.
"""

from tasks.notify import TASK_LOG, TASK_READY
from tasks.states import TaskStatus, guarded_update

# -- The claim connections' settings (they run CLAIM and nothing else). --
# A claim is a few index probes and an update by address, whatever the table holds. A queue
# table's statistics are always behind (taken when it was empty, or before the last burst), and
# on them the planner would scan the table or hash every PENDING task against the pick; so no
# sequential scans, hash or merge joins on these connections. (The status-change triggers that
# run inside a claim read their transition tables and join task_runs by index either way.)
# The claim is planned once per connection: a plan for any queue and limit is the same index
# probes, and planning it (about 0.5 ms) cost three times running it, in every claim; left to
# choose, PostgreSQL keeps planning it afresh. tests/dispatcher/test_claim_plan.py checks the
# generic plan.
# These are session settings, set once per connection, because a plan is made before any of the
# statement runs. They only steer plans, never what a statement does or how durably it commits,
# and the claim pool has a session of its own (VALKA_DIRECT_DATABASE_URL behind a pooler; see
# valka/poolers.py): through a transaction pooler they would reach other clients' plans, nothing more.
# Durability is not set here: CLAIM sets it for its own transaction.
CLAIM_SESSION = ("SET enable_seqscan = off; SET enable_hashjoin = off; "
                 "SET enable_mergejoin = off; SET plan_cache_mode = force_generic_plan")

# -- The dispatcher's other connections: starts, results, heartbeats, logs, sessions. --
# Every statement they run reads tasks and task_runs by key, a batch at a time. Behind
# statistics (a young table, a burst since the last ANALYZE), the planner would rather scan a
# table it believes small than look up a batch of keys. That holds for the foreign key checks
# of new runs and log lines too, whose plans a connection keeps: planned while tasks was
# nearly empty, each check scanned the whole table once it had grown.
# tests/dispatcher/test_writer_plans.py checks the plans.
# These connections may go through a transaction pooler (DATABASE_URL): there the setting lands
# on whichever server connection ran it and steers the plans of whoever gets that connection next,
# and the writer's own statements may run without it (planned as PostgreSQL would anyway). It
# changes plans only, never results or durability.
WRITER_SESSION = "SET enable_seqscan = off"

# -- Claim up to %(limit)s due PENDING tasks of one queue: highest priority, then due time, then age. --
# Priority by priority: the queue's PENDING priorities are found one index probe each
# (`priorities`), then claimed from, highest first; within one priority the due tasks are a range
# of tasks_queue_status_idx (queue, status, priority DESC, run_at, id) that ends at the first task
# not yet due. The probes read each priority's newest entry, from the lowest priority up: the
# oldest entries of a range are mostly those of tasks claimed since the last vacuum (an update
# leaves the old entry behind), and a probe from that end would walk past them all. A single
# scan of the queue in claim order would read past every future-scheduled task of a priority
# before giving up on it: with many tasks scheduled for later and few due, every claim read
# them all. The scans stop at the limit; only the claimed rows are sorted, into claim order.
# Within the priority %(after_priority)s the due range starts after (%(after_run_at)s, %(after_id)s)
# when they are given: the last task this node claimed there, while a backlog lasts. The range
# before it holds mostly the entries claimed tasks left behind, which every claim would otherwise
# walk again (dispatcher.claimer decides when to give it, and when to look behind it again).
# SKIP LOCKED lets dispatchers claim side by side without waiting on each other.
# The claim's commit does not wait for the WAL flush: a claim a crash of PostgreSQL loses leaves
# its task PENDING, to be claimed again (at-least-once, as for any crash after a send), and the
# start written after it is durable only once the claim is too. The statement says so for its own
# transaction (set_config(..., true), evaluated once, before the rows are returned: the one-time
# filter of the last SELECT), so it costs no round trip and never outlives the claim, even on a
# connection a pooler hands to someone else next.
# The UPDATE reaches the picked rows by their physical address (a TID scan; they are locked, so
# they cannot move): joined on id, the planner, trusting stale statistics right after a bulk
# insert, walked the whole PENDING index for every picked row.
CLAIM = """
WITH RECURSIVE priorities(priority) AS (
    (SELECT priority FROM tasks WHERE status = 'PENDING' AND queue = %(queue)s ORDER BY priority LIMIT 1)
    UNION ALL
    SELECT (SELECT t.priority FROM tasks t
            WHERE t.status = 'PENDING' AND t.queue = %(queue)s AND t.priority > p.priority
            ORDER BY t.priority LIMIT 1)
    FROM priorities p WHERE p.priority IS NOT NULL
), picked AS MATERIALIZED (
    SELECT due.ctid
    FROM (SELECT priority FROM priorities WHERE priority IS NOT NULL ORDER BY priority DESC) p
    CROSS JOIN LATERAL (
        SELECT t.ctid FROM tasks t
        WHERE t.status = 'PENDING' AND t.queue = %(queue)s AND t.priority = p.priority AND t.run_at <= now()
          AND (t.run_at, t.id) > (
              CASE WHEN p.priority = %(after_priority)s THEN %(after_run_at)s::timestamptz ELSE '-infinity' END,
              CASE WHEN p.priority = %(after_priority)s THEN %(after_id)s::uuid
                   ELSE '00000000-0000-0000-0000-000000000000' END)
        ORDER BY t.run_at, t.id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    ) due
    LIMIT %(limit)s
), claimed AS (
    """ + guarded_update(
    TaskStatus.DISPATCHING,
    sources=[TaskStatus.PENDING],
    where="ctid = ANY(ARRAY(SELECT ctid FROM picked))",
    set="claimed_by = %(node_id)s",
    returning="id::text, task_name, queue, input::text, metadata::text, attempt_count + 1 AS attempt_number, "
              "timeout_seconds, priority, run_at",
) + """
)
SELECT * FROM claimed
WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL
ORDER BY priority DESC, run_at, id
"""


def claim_params(*, queue: str, limit: int, node_id: str, after: tuple | None = None) -> dict:
    """CLAIM's parameters; `after` is (priority, run_at, task id) to start after, or None."""
    priority, run_at, task_id = after if after is not None else (None, None, None)
    return {"queue": queue, "limit": limit, "node_id": node_id, "after_priority": priority,
            "after_run_at": run_at, "after_id": task_id}

# -- Sent: DISPATCHING → RUNNING, one attempt counted, the run row written with its lease. --
# A task cancelled between claim and send is not DISPATCHING any more: no run is written for it;
# nor for one another node claimed since (claimed_by), should this node have stalled that long.
# Each task of the batch is looked up by id and locked (`locked`), one probe per task, and then
# moved by its physical address, as a claim does. Joined to the batch in one UPDATE, the tasks
# could be reached from the other side: statistics taken while nothing was DISPATCHING call
# that status empty, and on them the planner read every DISPATCHING task first and compared
# each with the whole batch (2.2 million comparisons, 1.5 s, for a pass of 1,500 starts). Here
# the UPDATE joins nothing, and a lateral look-up with a lock can only run once per task.
# The lock holds each row as read until the commit, so every locked task moves and its run
# row comes from `locked` directly.
START_RUNS = """
WITH locked AS MATERIALIZED (
    SELECT t.ctid AS tid, t.id, t.attempt_count + 1 AS attempt_number, t.timeout_seconds, i.run_id, i.worker_id
    FROM unnest(%(task_ids)s::uuid[], %(run_ids)s::uuid[], %(worker_ids)s::text[]) AS i(task_id, run_id, worker_id)
    CROSS JOIN LATERAL (
        SELECT ctid, id, attempt_count, timeout_seconds FROM tasks
        WHERE id = i.task_id AND status = 'DISPATCHING' AND claimed_by = %(node_id)s
        FOR UPDATE
    ) t
), moved AS (
    """ + guarded_update(
    TaskStatus.RUNNING,
    sources=[TaskStatus.DISPATCHING],
    where="ctid = ANY(ARRAY(SELECT tid FROM locked))",
    set="attempt_count = attempt_count + 1, started_at = now(), error_message = NULL",
) + """
)
INSERT INTO task_runs (id, task_id, attempt_number, worker_id, status, lease_expires_at, started_at,
                       last_heartbeat_at)
SELECT run_id, id, attempt_number, worker_id, 'RUNNING', now() + make_interval(secs => timeout_seconds),
       now(), now()
FROM locked
ON CONFLICT DO NOTHING
RETURNING task_id::text,
    EXISTS (SELECT 1 FROM signals s WHERE s.task_id = task_runs.task_id AND s.status = 'PENDING') AS has_signals
"""

# -- Not sent (the stream broke first): DISPATCHING → PENDING, no attempt counted; wake dispatchers. --
UNSEND = "WITH moved AS (" + guarded_update(
    TaskStatus.PENDING, sources=[TaskStatus.DISPATCHING],
    where="id = ANY(%(task_ids)s) AND claimed_by = %(node_id)s", returning="id, queue"
) + f") SELECT moved.id, pg_notify('{TASK_READY}', moved.queue)::text FROM moved"

# -- Heartbeats: extend the leases of the runs each worker really holds; ignore the rest. --
HEARTBEAT = """
UPDATE task_runs r
SET lease_expires_at = GREATEST(r.lease_expires_at, now() + make_interval(secs => %(extension)s)),
    last_heartbeat_at = now()
FROM unnest(%(worker_ids)s::text[], %(task_ids)s::uuid[]) AS i(worker_id, task_id)
WHERE r.task_id = i.task_id AND r.worker_id = i.worker_id AND r.status = 'RUNNING'
RETURNING r.task_id
"""

# -- Workers that sent a heartbeat, or that this dispatcher serves (its keep-alive): alive.
# Their last heartbeat, as the worker janitor reads it, and CONNECTED again if the janitor had
# given them up while this dispatcher could not write (a database outage): only the row of the
# session this dispatcher holds, so a worker that reconnected elsewhere is not touched. --
TOUCH_WORKERS = """
UPDATE workers w SET last_heartbeat_at = now(), status = 'CONNECTED', disconnected_at = NULL
FROM unnest(%(worker_ids)s::text[], %(session_ids)s::text[]) AS i(id, session_id)
WHERE w.id = i.id AND w.session_id = i.session_id AND w.node_id = %(node_id)s
"""

# -- Log lines, one INSERT per batch, ids in the order sent; lines of unknown runs are dropped.
# One NOTIFY per run of the batch wakes live tails (SubscribeLogs, the admin). --
INSERT_LOGS = f"""
WITH ins AS (
    INSERT INTO task_logs (run_id, task_id, timestamp, level, message, metadata)
    SELECT i.run_id, r.task_id, to_timestamp(i.ts_ms / 1000.0), i.level, i.message, i.metadata::jsonb
    FROM unnest(%(run_ids)s::uuid[], %(ts_ms)s::bigint[], %(levels)s::text[], %(messages)s::text[],
                %(metadata)s::text[]) WITH ORDINALITY AS i(run_id, ts_ms, level, message, metadata, ord)
    JOIN task_runs r ON r.id = i.run_id
    ORDER BY i.ord
    RETURNING run_id
)
SELECT count(pg_notify('{TASK_LOG}', run_id::text)) FROM (SELECT DISTINCT run_id FROM ins) runs
"""

# The application name of a dispatcher's LISTEN connection, followed by its node id: while that
# connection is open, the dispatcher is alive (WORKER_ROW).
LISTEN_APPLICATION = "valka-dispatcher-listen"

# -- A hello: the worker's row as it stands (any status), locked until the hello's transaction
# ends, so two hellos for one id are decided one after the other. Its process instance (the hello
# metadata's `valka.instance`), and whether its node is alive (that node's LISTEN connection is
# open; application names are cut at 63 bytes). --
WORKER_ROW = f"""
SELECT w.status, w.node_id, w.metadata ->> %(instance_key)s,
       EXISTS (SELECT 1 FROM pg_stat_activity a
               WHERE a.application_name = left('{LISTEN_APPLICATION} ' || w.node_id, 63)) AS node_alive
FROM workers w
WHERE w.id = %(id)s
FOR UPDATE
"""

# -- The RUNNING runs of a worker, to carry over into its new session (task_runs_worker_idx). --
RUNS_TO_ADOPT = """
SELECT r.id::text, r.task_id::text, t.queue, r.attempt_number
FROM task_runs r JOIN tasks t ON t.id = r.task_id
WHERE r.worker_id = %(worker_id)s AND r.finished_at IS NULL AND r.status = 'RUNNING'
"""

# -- A worker said hello: record (or take over) its row for this node and session. --
UPSERT_WORKER = """
INSERT INTO workers (id, name, queues, concurrency, status, node_id, session_id, metadata, connected_at,
                     last_heartbeat_at, disconnected_at)
VALUES (%(id)s, %(name)s, %(queues)s, %(concurrency)s, 'CONNECTED', %(node_id)s, %(session_id)s,
        %(metadata)s::jsonb, now(), now(), NULL)
ON CONFLICT (id) DO UPDATE SET
    name = EXCLUDED.name, queues = EXCLUDED.queues, concurrency = EXCLUDED.concurrency,
    status = 'CONNECTED', node_id = EXCLUDED.node_id, session_id = EXCLUDED.session_id,
    metadata = EXCLUDED.metadata, connected_at = now(), last_heartbeat_at = now(), disconnected_at = NULL
"""

# -- A session ended: only the session that still owns the row marks it DISCONNECTED. The row
# forgets the session, so a late TOUCH_WORKERS of it cannot make the worker CONNECTED again. --
DISCONNECT_WORKER = """
UPDATE workers SET status = 'DISCONNECTED', disconnected_at = now(), session_id = ''
WHERE id = %(id)s AND session_id = %(session_id)s AND status = 'CONNECTED'
RETURNING id
"""

# -- The sweep: of the runs this node's workers hold, those someone else closed (reaped, lost,
# cancelled) and those whose task has PENDING signals. Catches what a NOTIFY missed while the
# LISTEN connection was down, and runs the cluster gave up on while their worker went quiet. --
SWEEP = """
SELECT i.task_id::text, r.status, r.error_message,
       EXISTS (SELECT 1 FROM signals s WHERE s.task_id = i.task_id AND s.status = 'PENDING') AS has_signals
FROM unnest(%(task_ids)s::uuid[], %(run_ids)s::uuid[]) AS i(task_id, run_id)
LEFT JOIN task_runs r ON r.id = i.run_id
WHERE r.status IS DISTINCT FROM 'RUNNING'
   OR EXISTS (SELECT 1 FROM signals s WHERE s.task_id = i.task_id AND s.status = 'PENDING')
"""
