"""Signal statements: store, deliver, acknowledge, and hand back for redelivery."""

from tasks.notify import SIGNAL_SENT

# -- Store a signal for a task that is not finished; the task row is share-locked for the
# statement so a concurrent move to a final state either sees the signal or refuses it. --
INSERT_SIGNAL = f"""
WITH t AS (SELECT id FROM tasks WHERE id = %(task_id)s
           AND status IN ('PENDING', 'DISPATCHING', 'RUNNING', 'RETRY') FOR SHARE)
INSERT INTO signals (id, task_id, signal_type, payload, status, created_at)
SELECT %(id)s, t.id, %(signal_type)s, %(payload)s, 'PENDING', now() FROM t
RETURNING *, (SELECT count(*) FROM (SELECT pg_notify('{SIGNAL_SENT}', task_id::text)) n) AS notified
"""

# -- Take the PENDING signals of tasks this dispatcher has just started (or been told about),
# oldest first, and mark them DELIVERED; SKIP LOCKED keeps two deliveries from overlapping. --
TAKE_PENDING = """
WITH picked AS (
    SELECT id FROM signals WHERE task_id = ANY(%(task_ids)s) AND status = 'PENDING'
    ORDER BY id FOR UPDATE SKIP LOCKED
)
UPDATE signals s SET status = 'DELIVERED', delivered_at = now()
FROM picked WHERE s.id = picked.id
RETURNING s.id, s.task_id, s.signal_type, s.payload::text, s.created_at
"""

# -- Workers consumed signals of tasks they run: a batch of (signal, worker) pairs; a pair whose
# worker never ran the signal's task changes nothing. --
ACKNOWLEDGE = """
UPDATE signals s SET status = 'ACKNOWLEDGED', acknowledged_at = now()
FROM unnest(%(ids)s::uuid[], %(worker_ids)s::text[]) AS i(id, worker_id)
WHERE s.id = i.id AND s.status IN ('PENDING', 'DELIVERED')
  AND EXISTS (SELECT 1 FROM task_runs r WHERE r.task_id = s.task_id AND r.worker_id = i.worker_id)
RETURNING s.id
"""

# -- The attempt that got them is over without acknowledging: deliver again to the next one. --
REDELIVER = """
UPDATE signals SET status = 'PENDING', delivered_at = NULL
WHERE task_id = ANY(%(task_ids)s) AND status = 'DELIVERED'
"""
