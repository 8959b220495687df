"""Validation of a schedule, shared by the REST API, the admin and VALKA_SCHEDULES.

`parse_schedule_spec` turns a mapping into a `ScheduleSpec` or raises a ValidationError that
names the offending field; nothing is written before a spec is valid. The task a schedule
creates is checked by `tasks.specs.parse_task_spec`, the rules of `POST /api/v1/tasks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from schedules.models import MAX_SCHEDULE_NAME, CatchUp, Schedule
from schedules.slots import SlotError, Timing, cron_fields, zone
from tasks.errors import ValidationError, ValkaError
from tasks.specs import QUEUE_RE, QUEUE_RULE, TaskSpec, check_text, parse_datetime, parse_task_spec

# The metadata key each task a schedule creates carries: the schedule's name.
SCHEDULE_KEY = "valka.schedule"
MAX_INTERVAL = 2**31 - 1
TASK_FIELDS = ("task_name", "queue", "input", "metadata", "priority", "max_retries", "timeout_seconds")
TIMING_FIELDS = ("cron", "interval_seconds", "timezone", "start_at", "end_at")
FIELDS = ("name", *TIMING_FIELDS, "catch_up", "enabled", *TASK_FIELDS)
# What a schedule answers but nobody sets: ignored in a request (a GET's body may be sent back).
READ_ONLY = ("declared", "next_run_at", "upcoming", "last_run_at", "last_task_id", "last_task_status", "created_at",
             "updated_at")
# Task fields the schedule itself sets on every task it creates.
SET_BY_SCHEDULE = {"idempotency_key": "each task's key is schedule:<name>:<slot>",
                   "run_at": "each task is due at its slot", "scheduled_at": "each task is due at its slot"}
ALIASES = ("queue_name",)  # of queue, as POST /api/v1/tasks takes it


@dataclass(slots=True)
class ScheduleSpec:
    name: str
    cron: str | None
    interval_seconds: int | None
    timezone: str
    start_at: datetime | None
    end_at: datetime | None
    catch_up: str
    enabled: bool
    task: TaskSpec
    timing: Timing = field(init=False)

    def __post_init__(self) -> None:
        self.timing = Timing(cron_fields(self.cron) if self.cron else None, self.interval_seconds, self.timezone,
                             self.start_at, self.end_at)

    def columns(self) -> dict[str, Any]:
        """The model's fields this spec sets (all but what the scheduler keeps)."""
        return {
            "name": self.name, "cron": self.cron, "interval_seconds": self.interval_seconds,
            "timezone": self.timezone, "start_at": self.start_at, "end_at": self.end_at,
            "catch_up": self.catch_up, "enabled": self.enabled, "task_name": self.task.task_name,
            "queue": self.task.queue, "input": self.task.input, "metadata": self.task.metadata,
            "priority": self.task.priority, "max_retries": self.task.max_retries,
            "timeout_seconds": self.task.timeout_seconds,
        }


def schedule_fields(schedule: Schedule) -> dict[str, Any]:
    """A stored schedule as the mapping `parse_schedule_spec` takes (to apply a change to it)."""
    return {name: getattr(schedule, name) for name in FIELDS}


def timing_of(schedule: Schedule) -> Timing:
    """A stored (so valid) schedule's Timing."""
    return Timing(cron_fields(schedule.cron) if schedule.cron else None, schedule.interval_seconds,
                  schedule.timezone, schedule.start_at, schedule.end_at)


def parse_schedule_spec(data: Any) -> ScheduleSpec:
    """Validate a whole schedule (a new one, or a stored one with a change applied)."""
    if not isinstance(data, Mapping):
        raise ValidationError("the request body must be a JSON object", {"body": ["must be a JSON object"]})
    for key in data:
        if key in SET_BY_SCHEDULE:
            raise ValidationError.field(str(key), f"not part of a schedule: {SET_BY_SCHEDULE[key]}")
        if key not in FIELDS and key not in READ_ONLY and key not in ALIASES:
            raise ValidationError.field(str(key), "unknown field")
    name = _name(data.get("name"))
    cron, interval = data.get("cron"), data.get("interval_seconds")
    if cron in (None, "") and interval is None:
        raise ValidationError("cron or interval_seconds: one of them is required",
                              {"cron": ["give cron or interval_seconds"],
                               "interval_seconds": ["give cron or interval_seconds"]})
    if cron not in (None, "") and interval is not None:
        raise ValidationError("cron and interval_seconds: give only one of them",
                              {"cron": ["give only one of cron and interval_seconds"],
                               "interval_seconds": ["give only one of cron and interval_seconds"]})
    if cron not in (None, ""):
        if not isinstance(cron, str):
            raise ValidationError.field("cron", "must be a string")
        check_text("cron", cron)
        cron = " ".join(cron.split())
        if len(cron) > 255:
            raise ValidationError.field("cron", "must be at most 255 characters")
        _slot_check(lambda: cron_fields(cron))
        interval = None
    else:
        cron = None
        whole = isinstance(interval, int) or (isinstance(interval, float) and interval.is_integer())
        if isinstance(interval, bool) or not whole:
            raise ValidationError.field("interval_seconds", "must be a whole number of seconds")
        interval = int(interval)
        if not 1 <= interval <= MAX_INTERVAL:
            raise ValidationError.field("interval_seconds", f"must be between 1 and {MAX_INTERVAL} seconds")
    timezone = data.get("timezone")
    if timezone in (None, ""):
        timezone = "UTC"
    if not isinstance(timezone, str):
        raise ValidationError.field("timezone", "must be a string")
    check_text("timezone", timezone)
    _slot_check(lambda: zone(timezone))
    start_at = parse_datetime("start_at", data.get("start_at"))
    end_at = parse_datetime("end_at", data.get("end_at"))
    if start_at is not None and end_at is not None and end_at <= start_at:
        raise ValidationError.field("end_at", "must be after start_at")
    catch_up = data.get("catch_up")
    if catch_up in (None, ""):
        catch_up = CatchUp.LATEST.value
    if catch_up not in CatchUp.values:
        raise ValidationError.field("catch_up", f"must be one of {', '.join(CatchUp.values)}")
    enabled = data.get("enabled")
    if enabled is None:
        enabled = True
    if not isinstance(enabled, bool):
        raise ValidationError.field("enabled", "must be true or false")
    task = parse_task_spec({key: data.get(key) for key in (*TASK_FIELDS, *ALIASES) if key in data})
    if SCHEDULE_KEY in task.metadata:
        raise ValidationError.field("metadata", f"the key {SCHEDULE_KEY!r} is set by the schedule on each task")
    return ScheduleSpec(name=name, cron=cron, interval_seconds=interval, timezone=timezone, start_at=start_at,
                        end_at=end_at, catch_up=catch_up, enabled=enabled, task=task)


def _name(value: Any) -> str:
    if value in (None, ""):
        raise ValidationError.field("name", "this field is required")
    if not isinstance(value, str):
        raise ValidationError.field("name", "must be a string")
    if len(value) > MAX_SCHEDULE_NAME:
        raise ValidationError.field("name", f"must be at most {MAX_SCHEDULE_NAME} characters")
    check_text("name", value)
    if not QUEUE_RE.match(value):
        raise ValidationError.field("name", QUEUE_RULE)
    return value


def _slot_check(check: Any) -> None:
    try:
        check()
    except SlotError as exc:
        raise ValidationError.field(exc.field, exc.problem) from None


def declared_spec(index: int, entry: Any) -> ScheduleSpec:
    """An entry of VALKA_SCHEDULES; an invalid one names itself and its field."""
    label = f"VALKA_SCHEDULES[{index}]"
    if not isinstance(entry, Mapping):
        raise ValidationError(f"{label}: must be a dict of a schedule's fields, not {type(entry).__name__}",
                              {label: ["must be a dict"]})
    if isinstance(entry.get("name"), str):
        label += f" ({entry['name']})"
    try:
        return parse_schedule_spec(entry)
    except ValkaError as exc:
        raise ValidationError(f"{label}: {exc.message}", exc.details) from None
