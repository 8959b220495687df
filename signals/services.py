"""Sending signals to tasks: the one entry point for REST, gRPC and the admin."""

from __future__ import annotations

import time
from typing import Any

from django.db import connection
from psycopg.types.json import Jsonb

from signals.models import Signal, SignalStatus
from signals.sql import INSERT_SIGNAL
from tasks import selectors
from tasks.errors import InvalidState, NotFound, ValidationError
from tasks.specs import MAX_NAME, check_json, check_text
from tasks.states import TaskStatus
from valka.conf import valka_settings
from valka.ids import uuid7


def parse_signal_request(data: Any) -> tuple[str, Any]:
    """`signal_type` (or `signal_name`, as existing clients send it) and an optional JSON payload."""
    if not isinstance(data, dict):
        raise ValidationError("the request body must be a JSON object", {"body": ["must be a JSON object"]})
    # Each of the two names is validated when present; `signal_type` wins when both are.
    given = [(name, data[name]) for name in ("signal_type", "signal_name") if name in data]
    if not given:
        raise ValidationError.field("signal_type", "this field is required")
    for name, value in given:
        if not isinstance(value, str) or value == "":
            raise ValidationError.field(name, "must be a non-empty string")
        if len(value) > MAX_NAME:
            raise ValidationError.field(name, f"must be at most {MAX_NAME} characters")
        check_text(name, value)
    signal_type = given[0][1]
    payload = data.get("payload")
    check_json("payload", payload, valka_settings.MAX_SIGNAL_PAYLOAD_BYTES)
    return signal_type, payload


def signal_send(*, task_id: Any, signal_type: str, payload: Any = None,
                wait: float | None = None) -> tuple[Signal, bool]:
    """Store a signal in PENDING and wake the dispatchers; returns (signal, delivered).

    Refused (INVALID_STATE) when the task is finished, NOT_FOUND when it does not
    exist; nothing is stored then. When the task is running or being handed to a worker, waits
    up to `wait` seconds (VALKA_SIGNAL_DELIVERY_WAIT by default) for the dispatcher to deliver it.
    """
    signal_type, payload = parse_signal_request({"signal_type": signal_type, "payload": payload})
    task_uuid = selectors.parse_id(task_id, what="task")
    rows = list(Signal.objects.raw(INSERT_SIGNAL, {
        "id": uuid7(), "task_id": task_uuid, "signal_type": signal_type,
        "payload": None if payload is None else Jsonb(payload),
    }))
    if not rows:
        task = selectors.task_get(task_id=task_uuid)
        raise InvalidState(f"task {task.id} is {task.status}; signals go only to unfinished tasks",
                           {"status": task.status})
    signal = rows[0]
    delay = valka_settings.SIGNAL_DELIVERY_WAIT if wait is None else wait
    if delay > 0 and not connection.in_atomic_block:
        signal = _wait_delivered(signal, delay)
    return signal, signal.status != SignalStatus.PENDING


def _wait_delivered(signal: Signal, delay: float) -> Signal:
    from tasks.models import Task

    # A DISPATCHING task is being handed to a worker: the dispatcher delivers its signals as soon
    # as the start is written, milliseconds later, so that is worth waiting for too.
    if not Task.objects.filter(id=signal.task_id, status__in=(TaskStatus.DISPATCHING, TaskStatus.RUNNING)).exists():
        # Delivered after the next assignment, not now; or, by a quick worker, already: taken,
        # acknowledged and its task finished since the insert. The row says which.
        signal.refresh_from_db()
        return signal
    deadline = time.monotonic() + delay
    step = 0.005
    while time.monotonic() < deadline:
        time.sleep(step)
        step = min(step * 2, 0.05)
        status = Signal.objects.filter(id=signal.id).values_list("status", flat=True).first()
        if status and status != SignalStatus.PENDING:
            signal.refresh_from_db()
            break
    return signal


def signal_get(*, signal_id: Any) -> Signal:
    sid = selectors.parse_id(signal_id, what="signal")
    try:
        return Signal.objects.get(id=sid)
    except Signal.DoesNotExist:
        raise NotFound(f"signal {sid} not found") from None


def signal_list(*, task_id: Any, status: str | None = None):
    task = selectors.task_get(task_id=task_id)
    qs = Signal.objects.filter(task_id=task.id).order_by("id")
    if status:
        if status.upper() not in SignalStatus.values:
            raise ValidationError.field("status", f"must be one of {', '.join(SignalStatus.values)}")
        qs = qs.filter(status=status.upper())
    return qs


__all__ = ["parse_signal_request", "signal_get", "signal_list", "signal_send"]
