"""What the schedules' tests share: a schedule made straight in the table (any next_run_at), and
its tasks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from schedules.models import Schedule
from tasks.models import Task


def make_schedule(name: str = "every-minute", *, next_run_at: datetime | None, **fields: Any) -> Schedule:
    """A schedule row as the services would leave it, but with the next slot the test chooses."""
    values: dict[str, Any] = {"cron": "* * * * *", "task_name": "report", "queue": "reports"}
    if "interval_seconds" in fields:
        values.pop("cron")
    values.update(fields)
    return Schedule.objects.create(name=name, next_run_at=next_run_at, **values)


def tasks_of(name: str) -> list[Task]:
    """The tasks schedule `name` created, by slot."""
    return list(Task.objects.filter(metadata__contains={"valka.schedule": name}).order_by("run_at", "id"))


def keys_of(name: str) -> list[str]:
    return [task.idempotency_key for task in tasks_of(name)]
