"""The queues for which this process's producers just found no idle slot offered.

A single task's INSERT_TASK (tasks/sql/producer.py) first looks for a slot that a dispatcher offers
for the task's queue (dispatcher/offers.py): found, the task is handed to that dispatcher in its
INSERT. The look is about an eighth of the enqueue's time, and slots are offered only while the
queue's workers sit idle, which they rarely do while tasks come faster than one every few
milliseconds. So for MISS_SECONDS after INSERT_TASK found none for a queue, the process's next
tasks of that queue take INSERT_TASK_PENDING, which does not look: they are inserted PENDING and
claimed after their NOTIFY, the way a task that found no slot goes. Tasks further apart than that
(an idle system, where the handoff saves a claim's round trip) always look.

Kept per process, not shared: it only chooses between two statements that leave the same
guarantees, so a process that misses an offer meanwhile costs a task a claim, nothing more.

Each of the two comes in a second form without ON CONFLICT (INSERT_NEW_TASK,
INSERT_NEW_TASK_PENDING), for a task whose id the server makes and that has no idempotency key:
nothing can conflict with it, and the conflict check costs the insert a speculative insertion.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tasks.specs import TaskSpec
from tasks.sql.producer import INSERT_NEW_TASK, INSERT_NEW_TASK_PENDING, INSERT_TASK, INSERT_TASK_PENDING
from tasks.states import TaskStatus

MISS_SECONDS = 0.02  # the latency workload enqueues 50 ms apart: its tasks always look

_missed: dict[str, float] = {}  # queue -> time.monotonic() until which its tasks do not look


def statement(spec: TaskSpec) -> str:
    """The INSERT for `spec`: INSERT_TASK, or INSERT_TASK_PENDING just after a miss for its queue;
    each in its form without ON CONFLICT when `spec` has neither an id nor an idempotency key."""
    new = spec.id is None and spec.idempotency_key is None
    until = _missed.get(spec.queue)
    if until is not None and time.monotonic() < until:
        return INSERT_NEW_TASK_PENDING if new else INSERT_TASK_PENDING
    return INSERT_NEW_TASK if new else INSERT_TASK


def answered(sql: str, spec: TaskSpec, row: Sequence[Any] | None) -> None:
    """Note what INSERT_TASK's answer `row` says of its queue's offers: a task due now that was
    inserted PENDING found no slot (or a queue with controls, which offers none)."""
    if (sql is not INSERT_TASK and sql is not INSERT_NEW_TASK) or row is None or spec.run_at is not None:
        return
    if row[2] == TaskStatus.PENDING.value:
        _missed[spec.queue] = time.monotonic() + MISS_SECONDS
    else:
        _missed.pop(spec.queue, None)


def forget() -> None:
    """Every queue looks again at its next task."""
    _missed.clear()
