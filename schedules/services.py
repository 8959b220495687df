"""Writes: the schedules' one service layer, which the REST API, the admin and run_scheduler call.

Named entity-first with keyword-only arguments. The columns the scheduler keeps
(`next_run_at`, `last_*`, `fired_count`) are never written from a read made earlier: a change
locks its row first (`select_for_update`), so it waits for a firing batch that holds the row
and then sees what that batch wrote, and the firing loop, which skips locked rows, leaves the
row to its next pass. A change to a schedule's timing moves `next_run_at` to the first slot of
the new timing; any other change (`enabled` among them) leaves it, so catch-up still applies.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from schedules import selectors, sql
from schedules.models import Schedule
from schedules.specs import (
    SCHEDULE_KEY,
    TIMING_FIELDS,
    ScheduleSpec,
    declared_spec,
    parse_schedule_spec,
    schedule_fields,
)
from tasks.errors import InvalidState, ValidationError
from tasks.models import Task
from tasks.services import task_create
from tasks.specs import TaskSpec
from valka.conf import valka_settings

log = logging.getLogger("valka.schedules")

# The advisory lock that serializes reconciliations: the bytes "valkasdc" as a signed 64-bit key.
RECONCILE_KEY = int.from_bytes(b"valkasdc", "big", signed=True)


def schedule_create(*, data: Any) -> Schedule:
    """Validate `data` (the API's fields) and create the schedule; its first slot is computed now.
    A name already taken is a ValidationError naming `name`."""
    return _insert(parse_schedule_spec(data), declared=False)


def _insert(spec: ScheduleSpec, *, declared: bool) -> Schedule:
    now = timezone.now()
    schedule = Schedule(**spec.columns(), declared=declared, next_run_at=spec.timing.first(now=now))
    try:
        with transaction.atomic():
            schedule.save(force_insert=True)
    except IntegrityError:
        if Schedule.objects.filter(name=spec.name).exists():
            raise ValidationError.field("name", f"a schedule named {spec.name!r} exists already") from None
        raise
    return Schedule.objects.get(pk=schedule.pk)  # with the database's created_at and updated_at


def schedule_update(*, name: str, data: Any) -> Schedule:
    """Apply the fields of `data` to schedule `name` (a PATCH) and validate the result as a whole.

    A declared schedule (VALKA_SCHEDULES) takes only `enabled` here (a valid change to anything
    else is INVALID_STATE); the reconciliation changes the rest. The name cannot change."""
    if not isinstance(data, Mapping):
        raise ValidationError("the request body must be a JSON object", {"body": ["must be a JSON object"]})
    with transaction.atomic():
        schedule = selectors.schedule_get(name=name, for_update=True)
        if "name" in data and data["name"] != schedule.name:
            raise ValidationError.field("name", "cannot be changed (delete the schedule and create another)")
        spec = parse_schedule_spec({**schedule_fields(schedule), **data})
        if schedule.declared:
            # Compared as parsed, so a GET's body sent back (times as text) changes nothing.
            changed = sorted(key for key, value in spec.columns().items()
                             if key != "enabled" and value != getattr(schedule, key))
            if changed:
                raise InvalidState(f"schedule {name!r} is declared in VALKA_SCHEDULES: only enabled can be "
                                   f"changed here (not {', '.join(changed)})", {"declared": [True]})
        _apply(schedule, spec)
    return schedule


def _apply(schedule: Schedule, spec: ScheduleSpec) -> None:
    """Write `spec` over the locked `schedule`: a new timing gets the first slot of that timing."""
    before = {key: getattr(schedule, key) for key in TIMING_FIELDS}
    for key, value in spec.columns().items():
        setattr(schedule, key, value)
    fields = [*spec.columns(), "updated_at"]
    if before != {key: getattr(schedule, key) for key in TIMING_FIELDS}:
        schedule.next_run_at = spec.timing.first(now=timezone.now())
        fields.append("next_run_at")
    schedule.updated_at = timezone.now()
    schedule.save(update_fields=fields)


def schedule_delete(*, name: str) -> None:
    """Delete schedule `name`; the tasks it created stay. A declared one is refused (it would come back)."""
    with transaction.atomic():
        schedule = selectors.schedule_get(name=name, for_update=True)
        if schedule.declared:
            raise InvalidState(f"schedule {name!r} is declared in VALKA_SCHEDULES: remove it there",
                               {"declared": [True]})
        schedule.delete()


def schedule_trigger(*, name: str) -> Task:
    """Fire schedule `name` now, outside its slots: a task with the key `schedule:<name>:manual:<uuid>`,
    due at once, which becomes the schedule's last task. Its slots are left as they are."""
    with transaction.atomic():
        schedule = selectors.schedule_get(name=name, for_update=True)
        spec = TaskSpec(task_name=schedule.task_name, queue=schedule.queue, input=schedule.input,
                        metadata={**schedule.metadata, SCHEDULE_KEY: schedule.name}, priority=schedule.priority,
                        max_retries=schedule.max_retries, timeout_seconds=schedule.timeout_seconds,
                        idempotency_key=f"schedule:{schedule.name}:manual:{uuid.uuid4()}")
        task, _created = task_create(spec=spec)
        with connection.cursor() as cursor:
            cursor.execute(sql.MARK_TRIGGERED, {"id": schedule.id, "task_id": task.id, "at": task.created_at})
    return task


def schedules_set_enabled(*, ids: Sequence[int], enabled: bool) -> list[str]:
    """Enable or disable schedules (declared ones too); returns the names that changed. Enabling
    keeps `next_run_at`, so the slots missed meanwhile are handled by each one's catch_up."""
    with connection.cursor() as cursor:
        cursor.execute(sql.SET_ENABLED, {"ids": list(ids), "enabled": enabled})
        return [row[0] for row in cursor.fetchall()]


def schedules_reconcile(*, entries: Any = None) -> dict[str, list[str]]:
    """Make the declared schedules those of VALKA_SCHEDULES (or `entries`), by name: create the
    missing ones, update those that differ and delete declared ones no longer listed. Schedules
    made in the admin or API are never touched; a declared entry with the name of one is refused.
    Every entry is validated before anything is written (the error names the entry and its
    field); `enabled` is taken from an entry only when it creates its schedule, so a schedule
    paused in the admin stays paused across restarts. One transaction, serialized with any other
    scheduler's by an advisory lock. Returns the names created, updated and deleted."""
    entries = valka_settings.SCHEDULES if entries is None else entries
    if not isinstance(entries, list | tuple):
        raise ValidationError("VALKA_SCHEDULES: must be a list of schedules (dicts)",
                              {"VALKA_SCHEDULES": ["must be a list"]})
    specs = [declared_spec(i, entry) for i, entry in enumerate(entries)]
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValidationError(f"VALKA_SCHEDULES: names given twice: {', '.join(twice)}", {"name": twice})
    done: dict[str, list[str]] = {"created": [], "updated": [], "deleted": []}
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql.RECONCILE_LOCK, {"key": RECONCILE_KEY})
        existing = {s.name: s for s in Schedule.objects.select_for_update().filter(name__in=names)}
        for i, spec in enumerate(specs):
            current = existing.get(spec.name)
            if current is not None and not current.declared:
                raise ValidationError(f"VALKA_SCHEDULES[{i}] ({spec.name}): name: a schedule of this name was "
                                      "made in the admin or API; rename one of them", {"name": [spec.name]})
            if current is None:
                _insert(spec, declared=True)
                done["created"].append(spec.name)
                continue
            spec.enabled = current.enabled  # the admin's choice stands
            if spec.columns() != {key: getattr(current, key) for key in spec.columns()}:
                _apply(current, spec)
                done["updated"].append(spec.name)
        gone = Schedule.objects.filter(declared=True).exclude(name__in=names)
        done["deleted"] = sorted(gone.values_list("name", flat=True))
        gone.delete()
    for what, which in done.items():
        if which:
            log.info("VALKA_SCHEDULES: %s %s", what, ", ".join(which))
    return done
