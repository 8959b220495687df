"""Between our rows and the valka.v1 messages."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from tasks.errors import ValidationError
from tasks.models import Task, TaskLog
from tasks.states import TaskStatus
from valka.v1 import common_pb2, events_pb2, worker_pb2

TO_PROTO_STATUS = {s: getattr(common_pb2, f"TASK_STATUS_{s.value}") for s in TaskStatus}
FROM_PROTO_STATUS = {v: k for k, v in TO_PROTO_STATUS.items()}


def rfc3339(value: datetime | None) -> str:
    return value.isoformat().replace("+00:00", "Z") if value else ""


def dump_json(value: Any) -> str:
    return "" if value is None else json.dumps(value, separators=(",", ":"))


def load_json(field: str, text: str) -> Any:
    """A JSON string field of a request; "" means none."""
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise ValidationError.field(field, "must be a JSON-encoded string") from None


def task_meta(task: Task) -> common_pb2.TaskMeta:
    return common_pb2.TaskMeta(
        id=str(task.id), queue_name=task.queue, task_name=task.task_name,
        status=TO_PROTO_STATUS[TaskStatus(task.status)], priority=task.priority, max_retries=task.max_retries,
        attempt_count=task.attempt_count, timeout_seconds=task.timeout_seconds,
        idempotency_key=task.idempotency_key or "", input=dump_json(task.input),
        metadata=dump_json(task.metadata if task.metadata is not None else {}), output=dump_json(task.output),
        error_message=task.error_message or "", scheduled_at=rfc3339(task.run_at),
        created_at=rfc3339(task.created_at), updated_at=rfc3339(task.updated_at),
    )


LOG_LEVELS = {"DEBUG": common_pb2.LOG_LEVEL_DEBUG, "INFO": common_pb2.LOG_LEVEL_INFO,
              "WARN": common_pb2.LOG_LEVEL_WARN, "ERROR": common_pb2.LOG_LEVEL_ERROR}


def _status(name: str | None) -> int:
    try:
        return TO_PROTO_STATUS[TaskStatus(name)] if name else common_pb2.TASK_STATUS_UNSPECIFIED
    except ValueError:
        return common_pb2.TASK_STATUS_UNSPECIFIED


def task_event(event: dict[str, Any]) -> events_pb2.TaskEvent:
    """An event as the task event triggers announce it (see migration 0006)."""
    return events_pb2.TaskEvent(
        event_id=str(event.get("event_id", "")), task_id=str(event.get("task_id", "")),
        queue_name=event.get("queue_name") or "", previous_status=_status(event.get("previous_status")),
        new_status=_status(event.get("new_status")), worker_id=event.get("worker_id") or "",
        node_id=event.get("node_id") or "", attempt_number=int(event.get("attempt_number") or 0),
        error_message=event.get("error_message") or "", timestamp_ms=int(event.get("timestamp_ms") or 0),
    )


def log_entry(line: TaskLog) -> worker_pb2.LogEntry:
    return worker_pb2.LogEntry(
        task_run_id=str(line.run_id), timestamp_ms=int(line.timestamp.timestamp() * 1000),
        level=LOG_LEVELS.get(line.level, common_pb2.LOG_LEVEL_INFO), message=line.message,
        metadata=dump_json(line.metadata),
    )
