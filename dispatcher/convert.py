"""Between our rows and the valka.v1 messages."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from tasks.errors import ValidationError
from tasks.models import Task
from tasks.states import TaskStatus
from valka.v1 import common_pb2

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
