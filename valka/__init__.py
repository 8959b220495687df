"""Valka: a distributed task queue for Django whose only infrastructure is PostgreSQL.

Django code enqueues in process, inside its own transaction if it has one:

    from valka import enqueue
    enqueue("send_email", queue="emails", input={"to": "ada@example.com"})

`enqueue` and `enqueue_many` are the service layer's `task_enqueue` and
`task_enqueue_many`, `get_task` and `list_task_runs` the REST API's reads (the Django task
backend's in-process mode uses all four); Django is imported on the first call only, so
`import valka` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from datetime import datetime
    from uuid import UUID

    from tasks.models import Task

__all__ = ["enqueue", "enqueue_many", "get_task", "list_task_runs"]


def enqueue(
    task_name: str,
    *,
    queue: str = "default",
    input: Any = None,
    metadata: Mapping[str, Any] | None = None,
    priority: int | None = None,
    max_retries: int | None = None,
    timeout_seconds: int | None = None,
    idempotency_key: str | None = None,
    run_at: datetime | str | None = None,
    id: UUID | str | None = None,
    concurrency_key: str | None = None,
) -> Task:
    """Enqueue one task; it commits with the caller's transaction, NOTIFY included, or not at all.

    Raises `tasks.errors.ValidationError` (or `PayloadTooLarge`) for invalid
    arguments. With an idempotency key that exists, or an `id` (a UUID the
    caller made) that exists, returns the existing task.
    """
    from tasks.services import task_enqueue

    return task_enqueue(task_name=task_name, queue=queue, input=input, metadata=metadata, priority=priority,
                        max_retries=max_retries, timeout_seconds=timeout_seconds,
                        idempotency_key=idempotency_key, run_at=run_at, id=id, concurrency_key=concurrency_key)


def enqueue_many(tasks: Iterable[Mapping[str, Any]]) -> list[Task]:
    """Enqueue up to 1,000 tasks with one INSERT, in order; each item holds `enqueue`'s arguments.

    All are validated before anything is written: the first invalid item raises.
    Same transaction rules as `enqueue`, with one NOTIFY per queue.
    """
    from tasks.services import task_enqueue_many

    return task_enqueue_many(
        item if "queue" in item or "queue_name" in item else {**item, "queue": "default"} for item in tasks
    )


def get_task(task_id: UUID | str) -> dict[str, Any]:
    """The task as `GET /api/v1/tasks/{id}` answers it. Raises `tasks.errors.NotFound`."""
    from tasks import selectors
    from tasks.api.serializers import task_data

    return task_data(selectors.task_get(task_id=task_id))


def list_task_runs(task_id: UUID | str) -> list[dict[str, Any]]:
    """The task's runs, by attempt, as `GET /api/v1/tasks/{id}/runs` answers them. Raises `tasks.errors.NotFound`."""
    from tasks import selectors
    from tasks.api.serializers import TaskRunSerializer

    return list(TaskRunSerializer(selectors.task_runs(task_id=task_id), many=True).data)
