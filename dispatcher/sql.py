"""The dispatcher's hot-path statements: claim, start, un-send, heartbeat, logs, workers.

Each runs once per batch, never once per message. Status changes are built by
`tasks.states.guarded_update`.
"""

from tasks.notify import TASK_LOG, TASK_READY
from tasks.sql.queues import CONTROLLED, PAUSED_NOW
from tasks.states import TaskStatus, guarded_update

# What a claim answers for each task it claimed (dispatcher.claimer reads them in this order).
CLAIMED = ("id::text, task_name, queue, input::text, metadata::text, attempt_count + 1 AS attempt_number, "
           "timeout_seconds, priority, run_at")

# A claim's move: its `picked` rows, by address, PENDING → DISPATCHING for this node.
MOVE_PICKED = guarded_update(TaskStatus.DISPATCHING, sources=[TaskStatus.PENDING],
                             where="ctid = ANY(ARRAY(SELECT ctid FROM picked))", set="claimed_by = %(node_id)s",
                             returning=CLAIMED, by_address=True)

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
# valka/poolers.py), so they reach no other client's plans.
# Durability is not set here: CLAIM sets it for its own transaction.
# No JIT: a plan that must scan a table anyway (the queues' controls: no index serves their
# filter) is costed at 10^10 with sequential scans off, past every JIT threshold, and compiling
# it took 50 ms on each read, in the claim loop's way. Nothing these sessions run is long
# enough for JIT to pay.
CLAIM_SESSION = ("SET enable_seqscan = off; SET enable_hashjoin = off; "
                 "SET enable_mergejoin = off; SET plan_cache_mode = force_generic_plan; SET jit = off")

# -- The dispatcher's other connections: starts, results, heartbeats, logs, sessions. --
# Every statement they run reads tasks and task_runs by key, a batch at a time. Behind
# statistics (a young table, a burst since the last ANALYZE), the planner would rather scan a
# table it believes small than look up a batch of keys. That holds for the foreign key checks
# of new runs and log lines too, whose plans a connection keeps: planned while tasks was
# nearly empty, each check scanned the whole table once it had grown.
# tests/dispatcher/test_writer_plans.py checks the plans.
# Session settings, like CLAIM_SESSION's: the writer's pool also has a session of its own
# (VALKA_DIRECT_DATABASE_URL behind a pooler), where the settings steer its plans and no one else's.
# No JIT, for the reason CLAIM_SESSION gives.
WRITER_SESSION = "SET enable_seqscan = off; SET jit = off"

# -- A queue's PENDING priorities, one index probe each, lowest first; the last row is NULL. A
# recursive CTE, `priorities(priority)`, for a `WITH RECURSIVE` statement over %(queue)s. --
# The probes read each priority's newest entry, from the lowest priority up: the oldest entries
# of a range are mostly those of tasks claimed since the last vacuum (an update leaves the old
# entry behind), and a probe from that end would walk past them all.
PRIORITIES = """priorities(priority) AS (
    (SELECT priority FROM tasks WHERE status = 'PENDING' AND queue = %(queue)s ORDER BY priority LIMIT 1)
    UNION ALL
    SELECT (SELECT t.priority FROM tasks t
            WHERE t.status = 'PENDING' AND t.queue = %(queue)s AND t.priority > p.priority
            ORDER BY t.priority LIMIT 1)
    FROM priorities p WHERE p.priority IS NOT NULL
)"""

# -- A claim's look at its queue's row (`open`: it has no controls), one probe of the queues table. --
OPEN = """open AS MATERIALIZED (
    SELECT NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = %(queue)s AND """ + CONTROLLED + """) AS yes
)"""

# -- The end of a claim of a queue without controls: its `picked` rows moved, answered in claim order,
# committed without waiting for the WAL flush; or, if the queue has controls after all, one row
# whose id is NULL. --
# The claim's commit does not wait for the WAL flush: a claim a crash of PostgreSQL loses leaves
# its task PENDING, to be claimed again (at-least-once, as for any crash after a send), and the
# start written after it is durable only once the claim is too. The statement says so for its own
# transaction (set_config(..., true), evaluated once, before the rows are returned: the one-time
# filter of the last SELECT), so it costs no round trip and never outlives the claim, even on a
# connection a pooler hands to someone else next.
ANSWER = """claimed AS (
    """ + MOVE_PICKED + """
)
(SELECT * FROM claimed
 WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL
 ORDER BY priority DESC, run_at, id)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE NOT (SELECT yes FROM open)
"""

# -- Claim up to %(limit)s due PENDING tasks of a queue without controls: highest priority, then due time, then age. --
# The queue must have no controls (its row, if it has one, neither paused nor limited: `open`, one
# probe of the queues table): a queue that has them is claimed by CLAIM_LIMITED. A dispatcher picks
# the statement from what it last read of the queue's row (dispatcher.controls); should the row have
# changed since, this statement claims nothing and answers one row whose id is NULL, and the
# dispatcher rereads the row.
# Priority by priority: the queue's PENDING priorities are found one index probe each
# (PRIORITIES), then claimed from, highest first; within one priority the due tasks are a range
# of tasks_queue_status_idx (queue, status, priority DESC, run_at, id) that ends at the first task
# not yet due. A single scan of the queue in claim order would read past every future-scheduled
# task of a priority before giving up on it: with many tasks scheduled for later and few due,
# every claim read them all. The scans stop at the limit; only the claimed rows are sorted, into
# claim order.
# Within the priority %(after_priority)s the due range starts after (%(after_run_at)s, %(after_id)s)
# when they are given: the last task this node claimed there, while a backlog lasts. The range
# before it holds mostly the entries claimed tasks left behind, which every claim would otherwise
# walk again (dispatcher.claimer decides when to give it, and when to look behind it again).
# SKIP LOCKED lets dispatchers claim side by side without waiting on each other.
# It ends as ANSWER says (durability, and the NULL row).
# The UPDATE reaches the picked rows by their physical address (a TID scan; they are locked, so
# they cannot move): joined on id, the planner, trusting stale statistics right after a bulk
# insert, walked the whole PENDING index for every picked row.
CLAIM = """
WITH RECURSIVE """ + OPEN + """, """ + PRIORITIES + """, picked AS MATERIALIZED (
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
    WHERE (SELECT yes FROM open)
    LIMIT %(limit)s
), """ + ANSWER


def claim_params(*, queue: str, limit: int, node_id: str, after: tuple | None = None) -> dict:
    """CLAIM's parameters; `after` is (priority, run_at, task id) to start after, or None."""
    priority, run_at, task_id = after if after is not None else (None, None, None)
    return {"queue": queue, "limit": limit, "node_id": node_id, "after_priority": priority,
            "after_run_at": run_at, "after_id": task_id}


# -- Claim those of %(ids)s that are due PENDING tasks of a queue without controls: the tasks the
# NOTIFY of their insert named (tasks/sql/producer.py INSERT_TASK), each found by its primary key. --
# A dispatcher claims so only while its last full CLAIM of the queue came back short (nothing else
# was due: see dispatcher.claimer) and it has a free slot for every task named, so the tasks it takes
# are the ones CLAIM would take, one index probe each instead of the walk of the queue's priorities.
# A task another dispatcher took first, or cancelled, is skipped; the answer is CLAIM's.
CLAIM_IDS = """
WITH """ + OPEN + """, picked AS MATERIALIZED (
    SELECT t.ctid FROM tasks t
    WHERE t.id = ANY(%(ids)s::uuid[]) AND t.queue = %(queue)s AND t.status = 'PENDING' AND t.run_at <= now()
      AND (SELECT yes FROM open)
    FOR UPDATE SKIP LOCKED
), """ + ANSWER

# ---------------------------------------------------------------- offers and handoffs
# (dispatcher/offers.py says why a dispatcher offers idle slots; tasks/sql/producer.py INSERT_TASK
# takes them.)

# -- Offer %(slots)s slots of this node for %(queue)s (0: withdraw), for %(ttl)s seconds; answers
# 1 if written. A row a producer holds (its transaction open) is skipped, never waited for. --
OFFER = """
WITH mine AS (
    SELECT ctid FROM queue_offers WHERE queue = %(queue)s AND node_id = %(node_id)s FOR UPDATE SKIP LOCKED
), changed AS (
    UPDATE queue_offers o SET slots = %(slots)s, channel = %(channel)s,
                              expires_at = now() + make_interval(secs => %(ttl)s)
    WHERE o.ctid IN (SELECT ctid FROM mine)
    RETURNING 1
), added AS (
    INSERT INTO queue_offers (queue, node_id, channel, slots, expires_at)
    SELECT %(queue)s, %(node_id)s, %(channel)s, %(slots)s, now() + make_interval(secs => %(ttl)s)
    WHERE %(slots)s > 0
      AND NOT EXISTS (SELECT 1 FROM queue_offers WHERE queue = %(queue)s AND node_id = %(node_id)s)
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM changed) + (SELECT count(*) FROM added)
   + (SELECT count(*) FROM (SELECT 1 WHERE %(slots)s = 0
                            AND NOT EXISTS (SELECT 1 FROM queue_offers
                                            WHERE queue = %(queue)s AND node_id = %(node_id)s)) gone)
"""

# -- A stopping node's offers (those a producer holds lapse on their own). --
WITHDRAW_OFFERS = """
DELETE FROM queue_offers WHERE ctid IN (SELECT ctid FROM queue_offers WHERE node_id = %(node_id)s
                                        FOR UPDATE SKIP LOCKED)
"""

# -- Offers that lapsed a minute ago or more: their dispatchers are gone (a new node id per start). --
FORGET_LAPSED_OFFERS = """
DELETE FROM queue_offers WHERE ctid IN (SELECT ctid FROM queue_offers WHERE expires_at < now() - interval '1 minute'
                                        FOR UPDATE SKIP LOCKED)
"""

# -- A task handed to this node whose NOTIFY could not carry it (too large): what a claim answers. --
HANDED_TASK = f"""
SELECT {CLAIMED} FROM tasks
WHERE id = %(task_id)s AND status = '{TaskStatus.DISPATCHING.value}' AND claimed_by = %(node_id)s
"""

# -- Tasks handed to this node whose NOTIFY it never read (the LISTEN connection was down): of
# its queues, DISPATCHING for it for more than %(after)s seconds. The sweep puts back those it
# does not hold. --
HANDED_UNHEARD = f"""
SELECT id::text FROM tasks
WHERE queue = ANY(%(queues)s::text[]) AND status = '{TaskStatus.DISPATCHING.value}' AND claimed_by = %(node_id)s
  AND updated_at < now() - make_interval(secs => %(after)s)
"""

# ---------------------------------------------------------------- queues with controls
# (docs/queues.md says what each control does; this is how the claim keeps them.)

# -- Which queues have controls, as a dispatcher caches them (dispatcher.controls): paused (for how
# many more seconds, when the pause has an end), limited, and held to a rate. --
QUEUE_CONTROLS = f"""
SELECT q.name, {PAUSED_NOW} AS paused, EXTRACT(EPOCH FROM q.paused_until - now())::float8 AS resumes_in,
       q.max_running IS NOT NULL OR q.rate_limit IS NOT NULL OR q.max_running_per_key IS NOT NULL AS limited,
       q.rate_limit IS NOT NULL AS rated
FROM queues q
WHERE {CONTROLLED}
"""

# -- A hello names the queues a worker serves: each gets its row if it has none (tasks/sql/schema/queues.sql). --
ENSURE_QUEUES = "SELECT valka_queues_ensure(%(queues)s::text[])"

# -- The first statement of a limited claim's transaction: lock the queue's row until the claim
# commits, so that the claims of one limited queue run one at a time, whichever dispatcher makes
# them; and let the transaction commit without waiting for the WAL flush, as CLAIM does. --
# CLAIM_LIMITED counts in a statement of its own, whose snapshot is taken once the lock is held:
# it sees every claim committed before it (a count made in the locking statement would see the
# table as it was before the wait).
LOCK_QUEUE = """
SELECT set_config('synchronous_commit', 'off', true) FROM queues WHERE name = %(queue)s FOR NO KEY UPDATE
"""

# -- Claim up to %(limit)s due tasks of a queue with controls, after LOCK_QUEUE, in its transaction. --
# What the queue allows (`allowance`) is the least of:
# - nothing while it is paused;
# - max_running less its tasks DISPATCHING or RUNNING (`active`, counted up to max_running in two
#   ranges of tasks_queue_status_idx, one per status: with both statuses in one condition, the
#   planner was free to read the whole queue and filter, finished tasks included, and did): claims
#   are counted under the lock, and a task ends only by leaving those statuses, so no number of
#   dispatchers can take the queue past its limit;
# - rate_limit less the starts of the last rate_period_seconds and the tasks claimed but not yet
#   started (`rate_window`, `unstarted`). A sliding window, exact for the runs' started_at: the row
#   keeps stamps (`rate_stamps`, `rate_counts`), each no earlier than the starts it counts. Each
#   claim stamps the tasks that the claim before it left unstarted (`rate_pending`) and that have
#   left DISPATCHING since: they started (or went back unsent: counted all the same) before this
#   statement's clock, read after its snapshot. Stamps are rounded up to a 64th of the period, so
#   the row keeps at most about 65 of them; a start counts until its stamp is a period old.
#   The dispatcher claims again once its claimed tasks have started (dispatcher.claimer), which
#   keeps stamps a few milliseconds behind the starts. `retry_in` says when the window next lets a
#   task start, while it lets none.
# Without max_running_per_key the due tasks are picked as CLAIM picks them (`plain`). With it,
# the keys take turns (`fair`): the keys with PENDING tasks are found one probe each of
# tasks_key_pending_idx (`keys`), from the key after the last one served (`key_cursor`) round to
# it again, at most the allowance and 16 more (each step's key in a subquery kept apart by OFFSET
# 0: pulled up, the key that the step names twice was probed for twice); each key's running tasks
# are counted up to the limit in tasks_key_active_idx (`key_rooms`), and a key with room offers its
# first due tasks, up to an equal share of the allowance (`keyed`; a key whose room is less than
# its share reads one task more, `beyond`, which says its limit held it back), as do the tasks
# without a key, found among the queue's first due tasks, as many as the allowance and 16 more
# (`unkeyed`: no index holds them apart).
# The picks go round by round: each key's first task, then each key's second, and so on; the turn
# moves on to the last key served. When a key's share left the claim short while another key had
# more, it says so (`again`) and the dispatcher claims once more.
# Either pick reads one task more than it may claim: if it finds one, a limit held the claim back
# (`held`, counted in valka_queue_limited_total); so does a key found at its limit or with a task
# beyond its room. The picked rows are moved by their address, by a guarded update that skips any a
# cancel moved meanwhile; only this transaction claims the queue.
# The tasks answer first, as CLAIM answers them, then one row with `state` (limited; open: the queue
# has no controls any more, CLAIM serves it; paused; missing: it has no row), `held`, `retry_in`
# and `again`.
CLAIM_LIMITED = """
WITH RECURSIVE queue AS MATERIALIZED (
    SELECT q.*, """ + PAUSED_NOW + """ AS paused_now, """ + CONTROLLED + """ AS controlled,
           clock_timestamp() AS at, make_interval(secs => q.rate_period_seconds) AS period
    FROM queues q WHERE q.name = %(queue)s
), active AS MATERIALIZED (
    SELECT count(*)::int AS n FROM (
        (SELECT 1 FROM tasks t
         WHERE t.queue = %(queue)s AND t.status = 'DISPATCHING' AND (SELECT max_running FROM queue) IS NOT NULL
         LIMIT (SELECT max_running FROM queue))
        UNION ALL
        (SELECT 1 FROM tasks t
         WHERE t.queue = %(queue)s AND t.status = 'RUNNING' AND (SELECT max_running FROM queue) IS NOT NULL
         LIMIT (SELECT max_running FROM queue))
        LIMIT (SELECT max_running FROM queue)) a
), unstarted AS MATERIALIZED (
    SELECT count(*)::int AS n FROM tasks t
    WHERE t.queue = %(queue)s AND t.status = 'DISPATCHING' AND (SELECT rate_limit FROM queue) IS NOT NULL
), rate_window AS MATERIALIZED (
    SELECT array_agg(stamp ORDER BY stamp) AS stamps, array_agg(n ORDER BY stamp) AS counts,
           COALESCE(sum(n), 0)::int AS started
    FROM (SELECT stamp, sum(n)::int AS n FROM (
              SELECT s.stamp, s.n FROM queue q, unnest(q.rate_stamps, q.rate_counts) AS s(stamp, n)
              WHERE s.stamp > q.at - q.period
              UNION ALL
              SELECT to_timestamp(ceil(EXTRACT(EPOCH FROM q.at) * 64 / q.rate_period_seconds)
                                  * q.rate_period_seconds / 64), q.rate_pending - u.n
              FROM queue q, unstarted u
              WHERE q.rate_limit IS NOT NULL AND q.rate_pending > u.n
          ) seen GROUP BY stamp) w
), rooms AS MATERIALIZED (
    SELECT q.paused_now, q.controlled, q.max_running - a.n AS running_room,
           q.rate_limit - w.started - u.n AS rate_room, q.max_running_per_key AS per_key
    FROM queue q, active a, unstarted u, rate_window w
), allowance AS MATERIALIZED (
    -- Nothing when the queue has no row.
    SELECT COALESCE(CASE WHEN r.paused_now THEN 0 ELSE GREATEST(LEAST(%(limit)s, r.running_room, r.rate_room), 0) END,
                    0) AS n,
           CASE WHEN r.paused_now THEN NULL
                WHEN r.running_room < %(limit)s AND r.running_room <= COALESCE(r.rate_room, r.running_room)
                    THEN 'max_running'
                WHEN r.rate_room < %(limit)s THEN 'rate_limit' END AS reason,
           COALESCE(r.per_key IS NOT NULL AND NOT r.paused_now, false) AS fair
    FROM (VALUES (1)) one LEFT JOIN rooms r ON true
), """ + PRIORITIES + """, plain AS MATERIALIZED (
    SELECT due.ctid, p.priority, due.run_at, due.id, NULL::text AS key, 1::bigint AS round, 0 AS turn
    FROM (SELECT priority FROM priorities WHERE priority IS NOT NULL ORDER BY priority DESC) p
    CROSS JOIN LATERAL (
        SELECT t.ctid, t.run_at, t.id FROM tasks t
        WHERE t.status = 'PENDING' AND t.queue = %(queue)s AND t.priority = p.priority AND t.run_at <= now()
        ORDER BY t.run_at, t.id LIMIT (SELECT n + 1 FROM allowance)
    ) due
    WHERE EXISTS (SELECT 1 FROM rooms WHERE NOT paused_now) AND NOT (SELECT fair AND n > 0 FROM allowance)
    LIMIT (SELECT n + 1 FROM allowance)
), keys(key, first, turn) AS (
    SELECT f.key, f.key, 1 FROM (SELECT COALESCE(
        (SELECT t.concurrency_key FROM tasks t WHERE t.status = 'PENDING' AND t.queue = %(queue)s
           AND t.concurrency_key > (SELECT key_cursor FROM queue) ORDER BY t.concurrency_key LIMIT 1),
        (SELECT t.concurrency_key FROM tasks t WHERE t.status = 'PENDING' AND t.queue = %(queue)s
           AND t.concurrency_key IS NOT NULL ORDER BY t.concurrency_key LIMIT 1)) AS key OFFSET 0) f
    WHERE f.key IS NOT NULL AND (SELECT fair AND n > 0 FROM allowance)
    UNION ALL
    SELECT nxt.key, k.first, k.turn + 1 FROM keys k CROSS JOIN LATERAL (SELECT COALESCE(
        (SELECT t.concurrency_key FROM tasks t WHERE t.status = 'PENDING' AND t.queue = %(queue)s
           AND t.concurrency_key > k.key ORDER BY t.concurrency_key LIMIT 1),
        (SELECT t.concurrency_key FROM tasks t WHERE t.status = 'PENDING' AND t.queue = %(queue)s
           AND t.concurrency_key IS NOT NULL ORDER BY t.concurrency_key LIMIT 1)) AS key OFFSET 0) nxt
    WHERE k.turn < (SELECT n + 16 FROM allowance) AND nxt.key <> k.first
), key_rooms AS MATERIALIZED (
    SELECT k.key, k.turn, (SELECT per_key FROM rooms) - (SELECT count(*)::int FROM (
        SELECT 1 FROM tasks t
        WHERE t.queue = %(queue)s AND t.concurrency_key = k.key AND t.status IN ('DISPATCHING', 'RUNNING')
        LIMIT (SELECT per_key FROM rooms)) r) AS room
    FROM keys k
), unkeyed AS MATERIALIZED (
    SELECT u.ctid, u.priority, u.run_at, u.id, NULL::text AS key,
           row_number() OVER (ORDER BY u.priority DESC, u.run_at, u.id) AS round, 0 AS turn
    FROM (SELECT t.ctid, t.priority, t.run_at, t.id, t.concurrency_key FROM tasks t
          WHERE t.status = 'PENDING' AND t.queue = %(queue)s AND t.run_at <= now()
            AND (SELECT fair AND n > 0 FROM allowance)
          ORDER BY t.priority DESC, t.run_at, t.id LIMIT (SELECT n + 16 FROM allowance)) u
    WHERE u.concurrency_key IS NULL
    LIMIT (SELECT n FROM allowance)
), share AS MATERIALIZED (
    SELECT ceil((SELECT n FROM allowance)::numeric
                / GREATEST(count(*) FILTER (WHERE room > 0) + (SELECT count(*) FROM (SELECT 1 FROM unkeyed LIMIT 1) u),
                           1))::int AS n
    FROM key_rooms
), keyed AS MATERIALIZED (
    SELECT c.ctid, c.priority, c.run_at, c.id, r.key, c.round, r.turn, c.round > r.room AS beyond
    FROM key_rooms r CROSS JOIN share s CROSS JOIN LATERAL (
        SELECT t.ctid, t.priority, t.run_at, t.id, row_number() OVER (ORDER BY t.priority DESC, t.run_at, t.id) AS round
        FROM tasks t
        WHERE t.status = 'PENDING' AND t.queue = %(queue)s AND t.concurrency_key = r.key AND t.run_at <= now()
        ORDER BY t.priority DESC, t.run_at, t.id
        LIMIT CASE WHEN r.room < s.n THEN r.room + 1 ELSE s.n END
    ) c
    WHERE r.room > 0
), candidates AS MATERIALIZED (
    SELECT * FROM plain
    UNION ALL SELECT ctid, priority, run_at, id, key, round, turn FROM keyed WHERE NOT beyond
    UNION ALL SELECT * FROM unkeyed
), picked AS MATERIALIZED (
    SELECT ctid, key, round, turn FROM candidates
    ORDER BY round, turn, priority DESC, run_at, id LIMIT (SELECT n FROM allowance)
), claimed AS (
    """ + MOVE_PICKED + """
), kept AS (
    UPDATE queues q
    SET rate_stamps = w.stamps, rate_counts = w.counts,
        -- Without a rate limit nothing waits to be stamped: a limit set later counts no earlier claim.
        rate_pending = CASE WHEN q.rate_limit IS NULL THEN 0 ELSE u.n + (SELECT count(*) FROM claimed) END,
        key_cursor = COALESCE((SELECT key FROM picked WHERE key IS NOT NULL ORDER BY round DESC, turn DESC LIMIT 1),
                              (SELECT key FROM keys ORDER BY turn DESC LIMIT 1), q.key_cursor)
    FROM rate_window w, unstarted u
    WHERE q.name = %(queue)s AND (q.rate_limit IS NOT NULL OR q.max_running_per_key IS NOT NULL)
    RETURNING 1
), answer AS (
    SELECT CASE WHEN r.controlled IS NULL THEN 'missing' WHEN r.paused_now THEN 'paused'
                WHEN NOT r.controlled THEN 'open' ELSE 'limited' END AS state,
           CASE WHEN a.reason IS NOT NULL AND (SELECT count(*) FROM candidates) > a.n THEN a.reason
                WHEN EXISTS (SELECT 1 FROM key_rooms WHERE room <= 0) OR EXISTS (SELECT 1 FROM keyed WHERE beyond)
                    THEN 'max_running_per_key' END AS held,
           (SELECT EXTRACT(EPOCH FROM min(e.stamp + q.period - q.at))::float8
            FROM queue q, unstarted u, (
                SELECT s.stamp, sum(s.n) OVER (ORDER BY s.stamp DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                           AS newer
                FROM rate_window w, unnest(w.stamps, w.counts) AS s(stamp, n)) e
            WHERE r.rate_room - (SELECT count(*) FROM claimed) <= 0
              AND COALESCE(e.newer, 0) + u.n + (SELECT count(*) FROM claimed) < q.rate_limit) AS retry_in,
           (SELECT count(*) FROM claimed) < a.n AND EXISTS (
               SELECT 1 FROM key_rooms k, share s
               WHERE k.room > s.n AND (SELECT count(*) FROM keyed c WHERE c.key = k.key) = s.n) AS again
    FROM (VALUES (1)) one LEFT JOIN rooms r ON true CROSS JOIN allowance a
)
SELECT * FROM (
    (SELECT c.*, NULL::text AS state, NULL::text AS held, NULL::float8 AS retry_in, NULL::bool AS again, 1 AS part
     FROM claimed c)
    UNION ALL
    SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, state, held, retry_in, again, 2 FROM answer
) answered
ORDER BY part, priority DESC, run_at, id
"""

# -- The claims a limit held back, counted for /metrics (valka_queue_limited_total): one UPSERT of
# the claimer's counts since its last, into task_counters as the triggers keep them. --
RECORD_LIMITED = """
INSERT INTO task_counters AS c (minute, queue, kind, shard, n)
SELECT date_trunc('minute', now()), i.queue, 'limited_' || i.reason, pg_backend_pid(), sum(i.n)
FROM unnest(%(queues)s::text[], %(reasons)s::text[], %(counts)s::bigint[]) AS i(queue, reason, n)
GROUP BY i.queue, i.reason ORDER BY 2, 3
ON CONFLICT (minute, queue, kind, shard) DO UPDATE SET n = c.n + EXCLUDED.n
"""

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
    where="ctid = ANY(ARRAY(SELECT tid FROM locked))", by_address=True,
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

# -- A start and its successful result that reach the writer in one pass: DISPATCHING → RUNNING →
# COMPLETED as one row version of the task and one run row written COMPLETED (states.guarded_update,
# `through`). Under load most results come back within the pass their start waits for, and two
# versions of each row (each with its index entries) cost PostgreSQL about twice the one. No one
# could see the RUNNING version anyway: both were written in the writer's one transaction.
# Left to START_RUNS and COMPLETE_RUNS, in the same pass: a task with PENDING signals, which its
# start hands to the worker (signals.sql TAKE_PENDING), and every task while someone watches the
# task events, whose stream shows the start and the end each as its own change (events.sql). Tasks
# are looked up and locked as START_RUNS does; the update reaches them by address, joined to
# `locked` for their outputs. Returns the ids of the tasks it moved.
START_COMPLETED_RUNS = """
WITH locked AS MATERIALIZED (
    SELECT t.ctid AS tid, t.id, t.attempt_count + 1 AS attempt_number, t.timeout_seconds, i.run_id, i.worker_id,
           i.value
    FROM unnest(%(task_ids)s::uuid[], %(run_ids)s::uuid[], %(worker_ids)s::text[], %(values)s::text[])
         AS i(task_id, run_id, worker_id, value)
    CROSS JOIN LATERAL (
        SELECT ctid, id, attempt_count, timeout_seconds FROM tasks
        WHERE id = i.task_id AND status = 'DISPATCHING' AND claimed_by = %(node_id)s
          AND NOT EXISTS (SELECT 1 FROM signals s WHERE s.task_id = tasks.id AND s.status = 'PENDING')
        FOR UPDATE
    ) t
    WHERE NOT EXISTS (SELECT FROM task_event_watchers)
), moved AS (
    """ + guarded_update(
    TaskStatus.COMPLETED,
    sources=[TaskStatus.DISPATCHING], through=TaskStatus.RUNNING,
    from_="locked", where="tasks.ctid = locked.tid", by_address=True,
    set="attempt_count = tasks.attempt_count + 1, started_at = now(), output = locked.value::jsonb, "
        "error_message = NULL",
    returning="tasks.id",
) + """
)
INSERT INTO task_runs (id, task_id, attempt_number, worker_id, status, lease_expires_at, started_at,
                       last_heartbeat_at, finished_at, output)
SELECT l.run_id, l.id, l.attempt_number, l.worker_id, 'COMPLETED', now() + make_interval(secs => l.timeout_seconds),
       now(), now(), now(), l.value::jsonb
FROM locked l
ON CONFLICT DO NOTHING
RETURNING task_id::text
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
