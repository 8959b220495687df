"""The task state machine: the one place that knows which status may follow which.

Every status change in the project is a guarded compare-and-set built here:
`UPDATE tasks SET status = <to> ... WHERE <which rows> AND status IN (<allowed from>)`.
A row that lost a race (another process moved it first) simply is not
updated; callers compare what came back with what they asked for. Nothing
else in the code base writes `tasks.status`.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from tasks.errors import InvalidState


class TaskStatus(StrEnum):
    # In: created by a producer (API, SDK, admin), the retry engine (from RETRY),
    # or a dispatcher/reaper that could not hand a claimed task over.
    # Out: claimed by a dispatcher, or cancelled.
    PENDING = "PENDING"
    # In: claimed by a dispatcher (FOR UPDATE SKIP LOCKED), or handed to one by its producer's
    # INSERT (an idle slot the dispatcher offered). Out: sent (RUNNING), not sent (back to
    # PENDING, no attempt counted), or cancelled.
    DISPATCHING = "DISPATCHING"
    # In: the assignment reached a worker; a run row holds the lease.
    # Out: the worker's result, a cancellation, or the reaper/disconnect handler.
    RUNNING = "RUNNING"
    # Final: the handler returned.
    COMPLETED = "COMPLETED"
    # Final: the handler failed and said not to retry.
    FAILED = "FAILED"
    # In: a retryable failure or a lost run. Out: the retry engine, to PENDING
    # once the backoff has elapsed or to DEAD_LETTER when no retries are left.
    RETRY = "RETRY"
    # Final: retries exhausted; a dead_letter_queue row is written with it.
    DEAD_LETTER = "DEAD_LETTER"
    # Final: cancelled through the API or the admin.
    CANCELLED = "CANCELLED"


S = TaskStatus

TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    S.PENDING: frozenset({S.DISPATCHING, S.CANCELLED}),
    S.DISPATCHING: frozenset({S.RUNNING, S.PENDING, S.CANCELLED}),
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.RETRY, S.CANCELLED}),
    S.RETRY: frozenset({S.PENDING, S.DEAD_LETTER}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.DEAD_LETTER: frozenset(),
    S.CANCELLED: frozenset(),
}

# What a task is inserted as: PENDING, or DISPATCHING when its producer hands it straight to a
# dispatcher that offered an idle slot for its queue (tasks/sql/producer.py INSERT_TASK).
INITIAL_STATES: frozenset[TaskStatus] = frozenset({S.PENDING, S.DISPATCHING})

FINAL_STATES: frozenset[TaskStatus] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
ACTIVE_STATES: frozenset[TaskStatus] = frozenset(TaskStatus) - FINAL_STATES
# Final states a task can be replayed from, as a new PENDING task (a COMPLETED task is not rerun).
REPLAYABLE: tuple[TaskStatus, ...] = (S.DEAD_LETTER, S.FAILED, S.CANCELLED)


def ended_at(prefix: str = "") -> str:
    """When a task or a run that ends now ends: at now(), or at its start if that is later. A
    statement that waited for the start's commit (a cancel, a result on another node) may have
    begun before it, and nothing may end before it began. GREATEST skips a NULL start (a task
    that never ran). `prefix` qualifies the column (`"tasks."`)."""
    return f"GREATEST(now(), {prefix}started_at)"


def can_transition(source: str, target: str) -> bool:
    return TaskStatus(target) in TRANSITIONS[TaskStatus(source)]


def sources_of(target: str) -> tuple[TaskStatus, ...]:
    """Every status from which `target` may be reached, in a stable order."""
    return tuple(s for s in TaskStatus if TaskStatus(target) in TRANSITIONS[s])


def check_transition(source: str, target: str) -> None:
    if not can_transition(source, target):
        raise InvalidState(
            f"a task in {source} cannot move to {target}",
            {"status": source, "requested": str(target)},
        )


def _sql_list(values: Iterable[str]) -> str:
    return ", ".join(f"'{TaskStatus(v).value}'" for v in values)


def guarded_update(
    target: str,
    *,
    where: str,
    sources: Iterable[str] | None = None,
    set: str = "",
    table: str = "tasks",
    from_: str = "",
    returning: str = "id",
    by_address: bool = False,
    through: str | None = None,
) -> str:
    """Build the compare-and-set UPDATE that moves rows to `target`.

    `sources` narrows the statuses a row may come from (each must be a legal
    predecessor of `target`, checked here, at import time of the caller);
    `where` picks the rows (named placeholders such as `%(ids)s`); `set`
    adds assignments. Final states get `finished_at` (now, or the task's start if that is
    later) unless `set` gives it.
    Rows whose status is not among the sources are left alone: that is how
    a lost race shows, as a row missing from RETURNING.

    `by_address`: `where` picks the rows by their address (ctid), as the statements that lock
    their rows first do. The guard is then written so that no index can serve it, which leaves
    the planner the TID scan alone: planned on statistics taken while a status was rare (a
    queue's PENDING tasks before a burst), the guard looked cheaper to find by the status index,
    and the update walked every entry of that status to reach a few rows.

    `through`: the rows pass through this status on their way, two legal steps written as one
    row version (a start and its result that reach the dispatcher's writer together). No one can
    see them there, as no one could see the first step's version when both steps shared a
    transaction; the writes saved are a row version and its index entries per task.
    """
    target = TaskStatus(target)
    allowed = sources_of(through if through is not None else target)
    if through is not None and TaskStatus(target) not in TRANSITIONS[TaskStatus(through)]:
        raise ValueError(f"no transition {through} -> {target}")
    chosen = tuple(TaskStatus(s) for s in sources) if sources is not None else allowed
    illegal = [s for s in chosen if s not in allowed]
    if illegal or not chosen:
        raise ValueError(f"no transition {illegal or '(none)'} -> {through or target}")
    prefix = f"{table}." if from_ else ""
    assignments = [f"status = '{target.value}'", "updated_at = now()"]
    if target in FINAL_STATES and "finished_at" not in set:
        assignments.append(f"finished_at = {ended_at(prefix)}")
    if set:
        assignments.append(set)
    guard = f"{prefix}status IN ({_sql_list(chosen)})"
    if by_address:
        guard = f"({guard}) IS TRUE"  # the same rows; not an index condition
    return (
        f"UPDATE {table} SET {', '.join(assignments)}"
        f"{' FROM ' + from_ if from_ else ''}"
        f" WHERE ({where}) AND {guard}"
        f" RETURNING {returning}"
    )
