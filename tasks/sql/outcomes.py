"""How runs end: completed, failed, or failed/lost with a retry. Shared by the
dispatcher (worker results, disconnects) and the scheduler (expired leases).

Each statement closes runs that are still RUNNING and moves their tasks with
the state machine's guarded update, in one statement, for a whole batch. A
run that is no longer RUNNING (reaped, cancelled, answered twice) matches
nothing, so a stale or duplicate result changes nothing. `worker_id` may be
NULL in the input to skip the check that the run belongs to that worker.

The async helpers run on a psycopg AsyncConnection inside the caller's
transaction; they return the ids of the tasks that actually moved.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from tasks.sql.lifecycle import DEAD_LETTER_TASKS
from tasks.states import TaskStatus, ended_at, guarded_update
from valka.arrays import BinaryArray

_CLOSE = """
WITH input AS (
    SELECT * FROM unnest(%(run_ids)s::uuid[], %(worker_ids)s::text[], %(values)s::text[])
        AS i(run_id, worker_id, value)
), closed AS (
    UPDATE task_runs r SET status = '{run_status}', finished_at = """ + ended_at("r.") + """, {run_set}
    FROM input i
    WHERE r.id = i.run_id AND r.status = 'RUNNING' AND (i.worker_id IS NULL OR r.worker_id = i.worker_id)
    RETURNING r.task_id, r.attempt_number, i.value
)
"""

# -- Successful runs → COMPLETED (run and task), with the handler's output (JSON text). --
COMPLETE_RUNS = _CLOSE.format(run_status="COMPLETED", run_set="output = i.value::jsonb") + guarded_update(
    TaskStatus.COMPLETED,
    from_="closed",
    where="tasks.id = closed.task_id",
    set="output = closed.value::jsonb, error_message = NULL",
    returning="tasks.id",
)

# -- Non-retryable failures → FAILED (run and task), with the error. --
FAIL_RUNS = _CLOSE.format(run_status="FAILED", run_set="error_message = i.value") + guarded_update(
    TaskStatus.FAILED,
    from_="closed",
    where="tasks.id = closed.task_id",
    set="error_message = closed.value",
    returning="tasks.id",
)


def _retry_runs(run_status: str) -> str:
    # The task waits valka_retry_delay(attempt) before the retry engine makes it PENDING;
    # `exhausted` marks tasks with no attempts left, which move on to DEAD_LETTER.
    return _CLOSE.format(run_status=run_status, run_set="error_message = i.value") + guarded_update(
        TaskStatus.RETRY,
        from_="closed",
        where="tasks.id = closed.task_id",
        set=(
            "error_message = closed.value, run_at = now() + make_interval(secs => "
            "valka_retry_delay(closed.attempt_number, %(retry_base)s, %(retry_cap)s, %(retry_jitter)s))"
        ),
        returning="tasks.id, tasks.attempt_count > tasks.max_retries AS exhausted",
    )


# -- Retryable failures → run FAILED, task RETRY (or on to DEAD_LETTER). --
RETRY_FAILED_RUNS = _retry_runs("FAILED")
# -- Lost runs (lease expired, worker gone) → run LOST, task RETRY (or on to DEAD_LETTER). --
RETRY_LOST_RUNS = _retry_runs("LOST")

# Statements that other apps run in the same transaction for the tasks whose attempt ended in
# RETRY; each takes %(task_ids)s. An app whose rows follow a task's attempts adds its own in its
# AppConfig.ready(): the signals app hands the signals the ended attempt had not acknowledged
# back to PENDING, for the next attempt (signals.apps).
ON_RETRY: list[str] = []

# -- The RUNNING runs of a worker (for a disconnect or a replaced session). --
RUNNING_RUNS_OF_WORKER = ("SELECT id FROM task_runs "
                          "WHERE worker_id = %(worker_id)s AND finished_at IS NULL AND status = 'RUNNING'")


def _params(run_ids: Sequence[Any], worker_ids: Sequence[str | None] | None, values: Sequence[Any]) -> dict:
    return {
        "run_ids": BinaryArray(run_ids),
        "worker_ids": BinaryArray(worker_ids if worker_ids is not None else [None] * len(run_ids)),
        "values": BinaryArray(values),
    }


async def complete_runs(conn: Any, run_ids: Sequence[Any], worker_ids: Sequence[str | None] | None,
                        outputs: Sequence[str | None]) -> list[uuid.UUID]:
    cur = await conn.execute(COMPLETE_RUNS, _params(run_ids, worker_ids, outputs))
    return [row[0] for row in await cur.fetchall()]


async def fail_runs(conn: Any, run_ids: Sequence[Any], worker_ids: Sequence[str | None] | None,
                    errors: Sequence[str]) -> list[uuid.UUID]:
    cur = await conn.execute(FAIL_RUNS, _params(run_ids, worker_ids, errors))
    return [row[0] for row in await cur.fetchall()]


async def retry_runs(conn: Any, run_ids: Sequence[Any], worker_ids: Sequence[str | None] | None,
                     errors: Sequence[str], *, lost: bool, retry_params: dict[str, float]) -> list[uuid.UUID]:
    """Close runs as FAILED (or LOST) and move their tasks to RETRY, then the exhausted ones to
    DEAD_LETTER with their dead-letter rows, all in the caller's transaction."""
    sql = RETRY_LOST_RUNS if lost else RETRY_FAILED_RUNS
    cur = await conn.execute(sql, {**_params(run_ids, worker_ids, errors), **retry_params})
    rows = await cur.fetchall()
    if not rows:
        return []
    task_ids = [row[0] for row in rows]
    for statement in ON_RETRY:
        await conn.execute(statement, {"task_ids": task_ids})
    exhausted = [task_id for task_id, done in rows if done]
    if exhausted:
        await conn.execute(DEAD_LETTER_TASKS, {"ids": exhausted})
    return task_ids


async def lose_worker_runs(conn: Any, worker_id: str, error: str, retry_params: dict[str, float]) -> list[uuid.UUID]:
    """Every RUNNING run of `worker_id` is lost: its tasks retry (or dead-letter) right away."""
    cur = await conn.execute(RUNNING_RUNS_OF_WORKER, {"worker_id": worker_id})
    run_ids = [row[0] for row in await cur.fetchall()]
    if not run_ids:
        return []
    return await retry_runs(conn, run_ids, [worker_id] * len(run_ids), [error] * len(run_ids), lost=True,
                            retry_params=retry_params)
