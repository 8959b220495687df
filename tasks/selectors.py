"""Reads for the API, the admin and gRPC: plain ORM queries over indexed columns."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from tasks import dashboard
from tasks.errors import NotFound, ValidationError
from tasks.models import DeadLetter, Queue, Task, TaskLog, TaskRun, Worker
from tasks.specs import MAX_NAME, QUEUE_RE, check_text
from tasks.sql import queues as queues_sql
from tasks.states import TaskStatus

WORKER_STATUSES = ("CONNECTED", "DISCONNECTED")


def parse_id(value: Any, *, what: str) -> uuid.UUID:
    """A UUID, or NOT_FOUND: an id that cannot exist names nothing."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        raise NotFound(f"{what} {value!s:.100} not found") from None


def _filter_text(name: str, value: str) -> str:
    """A filter value PostgreSQL can compare (no NUL, valid Unicode), else VALIDATION_ERROR naming it."""
    check_text(name, value)
    return value


def task_get(*, task_id: Any) -> Task:
    task_id = parse_id(task_id, what="task")
    try:
        return Task.objects.get(id=task_id)
    except Task.DoesNotExist:
        raise NotFound(f"task {task_id} not found") from None


def task_list(
    *,
    queue: str | None = None,
    status: str | None = None,
    task_name: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> QuerySet[Task]:
    qs = Task.objects.all().order_by("-created_at", "-id")
    if queue:
        qs = qs.filter(queue=_filter_text("queue", queue))
    if status:
        try:
            qs = qs.filter(status=TaskStatus(status.upper()).value)
        except ValueError:
            raise ValidationError.field(
                "status", f"must be one of {', '.join(s.value for s in TaskStatus)}"
            ) from None
    if task_name:
        qs = qs.filter(task_name=_filter_text("task_name", task_name))
    if created_after:
        qs = qs.filter(created_at__gt=created_after)
    if created_before:
        qs = qs.filter(created_at__lt=created_before)
    return qs


def task_runs(*, task_id: Any) -> QuerySet[TaskRun]:
    task = task_get(task_id=task_id)
    return TaskRun.objects.filter(task_id=task.id).order_by("attempt_number")


def run_get(*, task_id: Any, run_id: Any) -> TaskRun:
    task = task_get(task_id=task_id)
    run_id = parse_id(run_id, what="run")
    try:
        return TaskRun.objects.get(id=run_id, task_id=task.id)
    except TaskRun.DoesNotExist:
        raise NotFound(f"run {run_id} of task {task.id} not found") from None


def run_logs(*, task_id: Any, run_id: Any, after: int | None = None) -> QuerySet[TaskLog]:
    run = run_get(task_id=task_id, run_id=run_id)
    qs = TaskLog.objects.filter(run_id=run.id).order_by("id")
    if after is not None:
        if not 0 <= after <= 2**63 - 1:
            raise ValidationError.field("after", "must be a log id (0 or more)")
        qs = qs.filter(id__gt=after)
    return qs


def run_log_page(*, run_id: Any, after: int, limit: int = 500) -> list[TaskLog]:
    """The next `limit` log lines of a run after line id `after` (live tails page with this)."""
    return list(TaskLog.objects.filter(run_id=run_id, id__gt=after).order_by("id")[:limit])


def run_state(*, run_id: Any) -> tuple[bool, bool]:
    """(the run exists, it is still RUNNING)."""
    status = TaskRun.objects.filter(id=run_id).values_list("status", flat=True).first()
    return status is not None, status == "RUNNING"


def dead_letter_get(*, dead_letter_id: Any) -> DeadLetter:
    dead_letter_id = parse_id(dead_letter_id, what="dead letter")
    try:
        return DeadLetter.objects.get(id=dead_letter_id)
    except DeadLetter.DoesNotExist:
        raise NotFound(f"dead letter {dead_letter_id} not found") from None


def dead_letter_list(*, queue: str | None = None) -> QuerySet[DeadLetter]:
    qs = DeadLetter.objects.all().order_by("-created_at", "-id")
    if queue:
        qs = qs.filter(queue=_filter_text("queue", queue))
    return qs


def worker_list(*, status: str | None = None) -> QuerySet[Worker]:
    qs = Worker.objects.all().order_by("-connected_at", "-id")
    if status:
        if status.upper() not in WORKER_STATUSES:
            raise ValidationError.field("status", f"must be one of {', '.join(WORKER_STATUSES)}")
        qs = qs.filter(status=status.upper())
    return qs


@dataclass(frozen=True)
class QueueView:
    """A queue: its settings (its row's, or the defaults while it has none) and what it holds now."""

    queue: Queue
    paused: bool  # its pause is in force now (a pause whose end has passed is over)
    counts: dict[str, int]  # its tasks by status, each counted up to dashboard.COUNT_CAP
    lag: float | None  # seconds its oldest due PENDING task has waited

    @property
    def paused_until(self) -> datetime | None:
        return self.queue.paused_until if self.paused else None

    @property
    def running(self) -> int:
        """Its tasks DISPATCHING or RUNNING: what max_running holds."""
        return self.counts.get(TaskStatus.DISPATCHING.value, 0) + self.counts.get(TaskStatus.RUNNING.value, 0)

    @property
    def counts_exact(self) -> bool:
        return all(n < dashboard.COUNT_CAP for n in self.counts.values())


def _unsaved_queue(name: str) -> Queue:
    return Queue(name=name, paused=False, paused_until=None, max_running=None, rate_limit=None,
                 rate_period_seconds=1, max_running_per_key=None, description="", created_at=None, updated_at=None)


def _queue_rows(names: list[str]) -> dict[str, Queue]:
    return {q.name: q for q in Queue.objects.raw(queues_sql.QUEUE_ROWS, {"names": names})}


def _view(name: str, rows: dict[str, Queue], counts: dict[str, int], lag: float | None) -> QueueView:
    queue = rows.get(name) or _unsaved_queue(name)
    statuses = {s.value: counts.get(s.value, 0) for s in TaskStatus}
    return QueueView(queue=queue, paused=bool(getattr(queue, "paused_now", False)), counts=statuses, lag=lag)


def queue_list() -> list[QueueView]:
    """Every queue that has a row, tasks, or a worker serving it, by name."""
    with connection.cursor() as cursor:
        cursor.execute(queues_sql.KNOWN_QUEUES)
        names = [row[0] for row in cursor.fetchall()]
    rows = _queue_rows(names)
    counts = dashboard.status_counts(cap=dashboard.COUNT_CAP)
    lag = dashboard.queue_lag()
    return [_view(name, rows, counts.get(name, {}), lag.get(name)) for name in names]


def queue_name(value: Any) -> str:
    """A queue name from a URL, or NOT_FOUND: a name no queue may have names none."""
    if not isinstance(value, str) or len(value) > MAX_NAME or not QUEUE_RE.match(value):
        raise NotFound(f"queue {value!s:.100} not found")
    return value


def queue_get(*, name: Any) -> QueueView:
    """One queue (with the defaults while it has tasks or workers and no row yet); NOT_FOUND if it
    has no row, tasks or workers."""
    name = queue_name(name)
    with connection.cursor() as cursor:
        rows = _queue_rows([name])
        if name not in rows:
            cursor.execute(queues_sql.QUEUE_IN_USE, {"name": name})
            if not cursor.fetchone()[0]:
                raise NotFound(f"queue {name} not found")
        cursor.execute(queues_sql.QUEUE_STATUS_COUNTS, {"name": name, "cap": dashboard.COUNT_CAP,
                                                        "statuses": [s.value for s in TaskStatus]})
        counts = dict(cursor.fetchall())
    return _view(name, rows, counts, dashboard.queue_lag().get(name))
