"""Inserting tasks: one statement for one task, one for a batch, NOTIFY included.

The NOTIFY is part of the caller's transaction, so dispatchers hear of a
task only once it is committed, and never of one that was rolled back.
"""

from tasks.notify import TASK_READY
from tasks.sql.queues import CONTROLLED
from tasks.states import TaskStatus

HANDED = TaskStatus.DISPATCHING.value  # a task handed to a dispatcher in its INSERT (states.INITIAL_STATES)
HANDOFF_BYTES = 7900  # the most a handoff's NOTIFY carries (PostgreSQL's limit is 8,000 bytes)

# -- Insert one task, handed straight to a dispatcher that offers an idle slot for its queue; an id
# or an idempotency key that exists already inserts nothing. --
# `input` and `metadata` arrive as JSON text. Returns what the server set (due and creation
# times, the status and the node it went to); the caller knows the rest.
# A task due now, of a queue without controls, for which a dispatcher offers an idle slot
# (queue_offers, dispatcher/offers.py), is inserted DISPATCHING, claimed by that dispatcher, and
# announced on its own channel with everything its worker needs: it is sent without a claim's
# round trip (a third of a new task's way to its handler on an idle system). The offer's row is
# taken with SKIP LOCKED, so concurrent producers never wait for each other: one that finds the
# offers held inserts the task PENDING. A dispatcher that cannot send a task handed to it puts
# it back (PENDING); one that died leaves it to the lease reaper, as it would a claimed task.
# Otherwise the task is PENDING, and its NOTIFY wakes dispatchers only when it is claimable now,
# naming it (`queue task_id`: queue names hold no space), so that an idle dispatcher can claim it
# by its id (dispatcher/sql.py CLAIM_IDS). A task alone could go through INSERT_TASKS as a batch
# of one, but this statement enqueues 10-25% faster (docs/performance.md, "Hand-made fast paths").
INSERT_TASK = f"""
WITH offer AS MATERIALIZED (
    SELECT o.ctid AS tid, o.node_id, o.channel FROM queue_offers o
    WHERE o.queue = %(queue)s AND o.slots > 0 AND o.expires_at > now()
      AND COALESCE(%(run_at)s, now()) <= now()
      AND NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = %(queue)s AND {CONTROLLED})
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), ins AS (
    INSERT INTO tasks (id, task_name, queue, status, claimed_by, priority, max_retries, attempt_count,
                       timeout_seconds, idempotency_key, input, metadata, run_at,
                       created_at, updated_at, replayed_from_task_id, replayed_from_dead_letter_id,
                       concurrency_key)
    VALUES (%(id)s, %(task_name)s, %(queue)s, COALESCE((SELECT '{HANDED}' FROM offer), 'PENDING'),
            (SELECT node_id FROM offer), %(priority)s, %(max_retries)s, 0,
            %(timeout_seconds)s, %(idempotency_key)s, %(input)s::jsonb, %(metadata)s::jsonb,
            COALESCE(%(run_at)s, now()), now(), now(), %(replayed_from_task_id)s,
            %(replayed_from_dead_letter_id)s, %(concurrency_key)s)
    ON CONFLICT DO NOTHING
    RETURNING id, task_name, queue, status, claimed_by, input, metadata, timeout_seconds, priority, run_at,
              created_at
), taken AS (
    UPDATE queue_offers o SET slots = o.slots - 1
    WHERE o.ctid = (SELECT tid FROM offer) AND EXISTS (SELECT 1 FROM ins WHERE ins.status = '{HANDED}')
    RETURNING o.channel
), handed AS (
    SELECT json_build_array(ins.id, ins.task_name, ins.queue, ins.input::text, ins.metadata::text, 1,
                            ins.timeout_seconds, ins.priority, ins.run_at)::text AS whole,
           json_build_array(ins.id, ins.queue)::text AS named
    FROM ins WHERE ins.status = '{HANDED}'
)
SELECT ins.run_at, ins.created_at, ins.status, ins.claimed_by,
       (SELECT count(*) FROM (SELECT pg_notify('{TASK_READY}', ins.queue || ' ' || ins.id::text)
                              WHERE ins.status = 'PENDING' AND ins.run_at <= now()) n)
       + (SELECT count(*) FROM (SELECT pg_notify(t.channel, CASE WHEN octet_length(h.whole) <= {HANDOFF_BYTES}
                                                               THEN h.whole ELSE h.named END)
                                FROM taken t, handed h) m) AS notified
FROM ins
"""

# The columns a task inserted PENDING is given, by INSERT_TASK_PENDING and INSERT_TASKS.
PENDING_COLUMNS = """id, task_name, queue, status, priority, max_retries, attempt_count, timeout_seconds,
                       idempotency_key, input, metadata, run_at, created_at, updated_at,
                       replayed_from_task_id, replayed_from_dead_letter_id, concurrency_key"""

# -- Insert one task PENDING, without looking for an offered slot. --
# INSERT_TASK's answer, with what it does when it finds no slot, for a task that does not look
# (tasks/offer_misses.py): a producer that just found none for the queue.
INSERT_TASK_PENDING = f"""
WITH ins AS (
    INSERT INTO tasks ({PENDING_COLUMNS})
    VALUES (%(id)s, %(task_name)s, %(queue)s, 'PENDING', %(priority)s, %(max_retries)s, 0,
            %(timeout_seconds)s, %(idempotency_key)s, %(input)s::jsonb, %(metadata)s::jsonb,
            COALESCE(%(run_at)s, now()), now(), now(), %(replayed_from_task_id)s,
            %(replayed_from_dead_letter_id)s, %(concurrency_key)s)
    ON CONFLICT DO NOTHING
    RETURNING id, queue, run_at, created_at
)
SELECT ins.run_at, ins.created_at, 'PENDING', NULL::text,
       CASE WHEN ins.run_at <= now() THEN pg_notify('{TASK_READY}', ins.queue || ' ' || ins.id::text)::text END
FROM ins
"""

# -- The two statements above, for a task that nothing can conflict with. --
# A task whose id the server made (a UUIDv7) and that has no idempotency key holds nothing that
# another row could hold, so its INSERT needs no ON CONFLICT. Without it PostgreSQL skips the
# speculative insertion: a probe of each arbiter index before the insert, and a WAL record that
# confirms it after. That was about 20 µs of a single task's 430 on the tasks table's floor,
# back to back (docs/performance.md). tasks/offer_misses.py chooses among the four.
ON_CONFLICT = "    ON CONFLICT DO NOTHING\n"


def _without_conflict(sql: str) -> str:
    assert sql.count(ON_CONFLICT) == 1
    return sql.replace(ON_CONFLICT, "")


INSERT_NEW_TASK = _without_conflict(INSERT_TASK)
INSERT_NEW_TASK_PENDING = _without_conflict(INSERT_TASK_PENDING)

# -- Insert a batch of tasks in one statement; ids or keys that exist already insert nothing. --
# The batch travels as one JSON array of objects (ids made by the caller), unpacked by
# jsonb_to_recordset: cheaper to send than one array per column, and one statement text for
# every batch size, so it is prepared once per connection (tasks.prepared). Rows go in key
# order, so two batches sharing keys take them in the same order and cannot deadlock on each
# other's uncommitted rows. Sends one NOTIFY per distinct queue that got a task claimable now, not
# one per task. Answers with one row: the ids inserted (comma-separated text, which costs
# nothing to read back) and the statement's now(), which is every new row's creation time
# and the due time of those that were given none.
INSERT_TASKS = f"""
WITH ins AS (
    INSERT INTO tasks ({PENDING_COLUMNS})
    SELECT i.id, i.task_name, i.queue, 'PENDING', i.priority, i.max_retries, 0,
           i.timeout_seconds, i.idempotency_key, i.input, i.metadata,
           COALESCE(i.run_at, now()), now(), now(), i.replayed_from_task_id, i.replayed_from_dead_letter_id,
           i.concurrency_key
    FROM jsonb_to_recordset(%(tasks)s::jsonb)
         AS i(id uuid, task_name text, queue text, priority int, max_retries int, timeout_seconds int,
              idempotency_key text, input jsonb, metadata jsonb, run_at timestamptz,
              replayed_from_task_id uuid, replayed_from_dead_letter_id uuid, concurrency_key text)
    ORDER BY i.idempotency_key, i.id
    ON CONFLICT DO NOTHING
    RETURNING id, queue, run_at
), notified AS (
    SELECT count(pg_notify('{TASK_READY}', ready.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins WHERE run_at <= now()) ready
)
SELECT (SELECT string_agg(id::text, ',') FROM ins) AS ids, now() AS created_at,
       (SELECT n FROM notified) AS notified
"""

# -- The tasks that hold some ids or idempotency keys (after conflicts). --
# ON CONFLICT DO NOTHING names no constraint: its arbiters are the primary key (ids that clients
# made, `POST /api/v1/tasks` with an `id`) and the partial unique index on the key. Ids the server
# makes never conflict.
SELECT_HOLDERS = "SELECT * FROM tasks WHERE id = ANY(%(ids)s::uuid[]) OR idempotency_key = ANY(%(keys)s::text[])"
