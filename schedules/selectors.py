"""Reads: schedules for the REST API, the admin and its overview panel."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from schedules import sql
from schedules.models import Schedule
from schedules.specs import timing_of
from tasks.errors import NotFound, ValidationError
from tasks.specs import check_text

UPCOMING = 5  # slots each schedule's JSON and admin page show


def schedule_get(*, name: str, for_update: bool = False) -> Schedule:
    """Schedule `name` (NOT_FOUND if none); `for_update` locks its row until the transaction ends."""
    check_text("name", name)
    qs = Schedule.objects.select_for_update() if for_update else Schedule.objects.select_related("last_task")
    try:
        return qs.get(name=name)
    except Schedule.DoesNotExist:
        raise NotFound(f"schedule {name!r} not found") from None


def schedule_list(*, enabled: str | None = None, queue: str | None = None,
                  declared: str | None = None) -> QuerySet[Schedule]:
    """Schedules by name; `enabled` and `declared` are "true" or "false" when given."""
    qs = Schedule.objects.select_related("last_task").order_by("name")
    for name, value in (("enabled", enabled), ("declared", declared)):
        if value is not None:
            qs = qs.filter(**{name: _bool(name, value)})
    if queue is not None:
        check_text("queue", queue)
        qs = qs.filter(queue=queue)
    return qs


def _bool(name: str, value: str) -> bool:
    text = value.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValidationError.field(name, "must be true or false")


def schedule_upcoming(schedule: Schedule, *, now: datetime | None = None, count: int = UPCOMING) -> list[datetime]:
    """The next `count` slots of `schedule` from `now` (its rule's, whether or not it is enabled)."""
    return timing_of(schedule).upcoming(now=now or timezone.now(), next_run_at=schedule.next_run_at, count=count)


def schedules_next_due(*, limit: int = 10) -> list[dict[str, Any]]:
    """The enabled schedules due next, with their last task's id and status (the overview's panel)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.NEXT_SCHEDULES, {"limit": limit})
        columns = ["id", "name", "cron", "interval_seconds", "timezone", "next_run_at", "last_run_at", "last_task_id",
                   "last_task_status"]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
