"""LISTEN/NOTIFY channel names. A notification only wakes a process up; the
rows are the truth, and every listener also polls now and then.
"""

import hashlib

# Payload: queue name, or `queue task_id` for one task inserted on its own (tasks/sql/producer.py
# INSERT_TASK). Sent when a task becomes claimable now (created, retried, due, put back).
TASK_READY = "valka_task_ready"
# Payload: task id. Sent when a task is cancelled, so the dispatcher holding it tells its worker.
TASK_CANCELLED = "valka_task_cancelled"
# Payload: task id. Sent when a signal is stored for a task.
SIGNAL_SENT = "valka_signal_sent"
# Payload: JSON of a TaskEvent. Sent for every status change (by a trigger).
TASK_EVENT = "valka_task_event"
# Payload: run id. Sent when log lines of a run are stored (once per run per batch).
TASK_LOG = "valka_task_log"
# Payload: queue name. Sent when a queue's controls change (paused, resumed, limits set).
QUEUE_CHANGED = "valka_queue_changed"
# Payload: queue name. Sent by a trigger (tasks/sql/schema/queues.sql) when tasks of a queue with
# max_running or max_running_per_key have ended: a slot is free for whichever node can claim.
QUEUE_SLOT_FREED = "valka_queue_slot_freed"
# Payload: an API key's hash, or '*' for all of them. Sent by a trigger (tasks/sql/schema/api_keys.sql)
# when a key is revoked, changed or deleted: processes that remember live keys forget it.
API_KEY_CHANGED = "valka_api_key_changed"


def handoff_channel(node_id: str) -> str:
    """A dispatcher's own channel (an identifier, whatever its node id holds). Payload: a task
    handed to it in its INSERT, as the JSON array of what a claim answers (dispatcher/sql.py
    CLAIMED), or `[id, queue]` when that would not fit in a NOTIFY (tasks/sql/producer.py
    INSERT_TASK, dispatcher/offers.py)."""
    return "valka_handoff_" + hashlib.sha256(node_id.encode()).hexdigest()[:24]
