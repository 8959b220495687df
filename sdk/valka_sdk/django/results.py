"""A Valka task and its runs, read as Django's `TaskResult`.

| Valka status | Django status |
|---|---|
| PENDING, DISPATCHING, RETRY | READY |
| RUNNING | RUNNING |
| COMPLETED | SUCCESSFUL (`return_value` from the output) |
| FAILED, DEAD_LETTER, CANCELLED | FAILED |

`errors` holds one `TaskError` per failed run (FAILED, LOST, CANCELLED), by attempt, with the
exception's class path and traceback that the worker sent (`valka_sdk.errors.parse_failure`);
a run whose message names no class stands as `valka_sdk.errors.RunFailed` (`RunLost` for a lost
run, `TaskCancelled` for a cancelled one), its message as the traceback. `worker_ids` names the
worker of each run, so `attempts` is Valka's attempt count.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.utils.module_loading import import_string

from valka_sdk.errors import parse_failure

if TYPE_CHECKING:
    from django.tasks.backends.base import BaseTaskBackend

STATUSES = {
    "PENDING": TaskResultStatus.READY, "DISPATCHING": TaskResultStatus.READY, "RETRY": TaskResultStatus.READY,
    "RUNNING": TaskResultStatus.RUNNING, "COMPLETED": TaskResultStatus.SUCCESSFUL,
    "FAILED": TaskResultStatus.FAILED, "DEAD_LETTER": TaskResultStatus.FAILED, "CANCELLED": TaskResultStatus.FAILED,
}
FAILED_RUNS = {"FAILED": "valka_sdk.errors.RunFailed", "LOST": "valka_sdk.errors.RunLost",
               "CANCELLED": "valka_sdk.errors.TaskCancelled"}


def parse_time(value: str | datetime | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)


def task_of(task_name: str, result_id: str) -> Task:
    """The `@task` a Valka task's name points at, or TaskResultDoesNotExist (not a Django task here)."""
    try:
        task = import_string(task_name)
    except ImportError:
        raise TaskResultDoesNotExist(f"{result_id}: its task {task_name!r} is not importable here") from None
    if not isinstance(task, Task):
        raise TaskResultDoesNotExist(f"{result_id}: {task_name!r} is not a @task")
    return task


def task_error(run: dict[str, Any]) -> TaskError:
    failure = parse_failure(run.get("error_message"))
    return TaskError(exception_class_path=failure.exception_class_path or FAILED_RUNS[run["status"]],
                     traceback=failure.traceback or failure.summary)


def task_result(backend: BaseTaskBackend, task: dict[str, Any], runs: list[dict[str, Any]]) -> TaskResult:
    """`task` (as `GET /api/v1/tasks/{id}` answers) with its `runs` (as `.../runs` does) as a TaskResult."""
    arguments = task.get("input")
    if not isinstance(arguments, dict) or not isinstance(arguments.get("args"), list) \
            or not isinstance(arguments.get("kwargs"), dict):
        raise TaskResultDoesNotExist(f"{task['id']}: not a Django task (its input has no args and kwargs)")
    found = task_of(task["task_name"], task["id"])
    changes = {"queue_name": task["queue"], "priority": task["priority"]}
    if parse_time(task["run_at"]) != parse_time(task["created_at"]):
        changes["run_after"] = parse_time(task["run_at"])
    if any(getattr(found, name) != value for name, value in changes.items()):
        try:
            found = found.using(**changes)
        except InvalidTask:
            pass  # enqueued elsewhere, to a queue or time this backend would not take: the task as declared
    runs = sorted(runs, key=lambda run: run["attempt_number"])
    result = TaskResult(
        task=found, id=task["id"], status=STATUSES[task["status"]], enqueued_at=parse_time(task["created_at"]),
        started_at=parse_time(runs[0]["started_at"]) if runs else None,
        finished_at=parse_time(task["finished_at"]),
        last_attempted_at=parse_time(runs[-1]["started_at"]) if runs else None,
        args=arguments["args"], kwargs=arguments["kwargs"], backend=backend.alias,
        errors=[task_error(run) for run in runs if run["status"] in FAILED_RUNS],
        worker_ids=[run["worker_id"] for run in runs],
    )
    if result.status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", task.get("output"))
    return result
