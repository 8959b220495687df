"""Validation of what producers send, shared by REST, gRPC, the admin and Python callers.

`parse_task_spec` turns a mapping (JSON body, gRPC request, form) into a
`TaskSpec` or raises an error that names the offending field. Nothing is
written before a spec is valid.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tasks.errors import PayloadTooLarge, ValidationError
from valka.conf import valka_settings

QUEUE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_NAME = 255
MAX_RETRIES_LIMIT = 1000
TIMEOUT_RANGE = (1, 86400)


@dataclass(frozen=True)
class TaskSpec:
    task_name: str
    queue: str
    input: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    max_retries: int = 3
    timeout_seconds: int = 300
    idempotency_key: str | None = None
    run_at: datetime | None = None  # None: now


def _text(name: str, value: Any, *, required: bool, max_len: int = MAX_NAME) -> str | None:
    if value is None or value == "":
        if required:
            raise ValidationError.field(name, "this field is required")
        return None
    if not isinstance(value, str):
        raise ValidationError.field(name, "must be a string")
    if len(value) > max_len:
        raise ValidationError.field(name, f"must be at most {max_len} characters")
    if "\x00" in value:
        raise ValidationError.field(name, "must not contain NUL characters")
    return value


def _int(name: str, value: Any, default: int, lo: int, hi: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValidationError.field(name, "must be an integer")
    if not lo <= value <= hi:
        raise ValidationError.field(name, f"must be between {lo} and {hi}")
    return value


def check_json(name: str, value: Any, limit: int) -> None:
    """Refuse a JSON value PostgreSQL cannot store or that is over `limit` bytes."""
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError):
        raise ValidationError.field(name, "must be valid JSON (no NaN or Infinity)") from None
    except RecursionError:
        raise ValidationError.field(name, "is nested too deeply") from None
    if len(encoded.encode()) > limit:
        raise PayloadTooLarge(
            f"{name}: larger than the limit of {limit} bytes", {name: [f"larger than {limit} bytes"]}
        )
    if "\x00" in encoded or "\\u0000" in encoded:
        raise ValidationError.field(name, "must not contain NUL characters (PostgreSQL cannot store them)")


def parse_datetime(name: str, value: Any) -> datetime | None:
    """RFC 3339 with a time zone (`Z` or an offset), or None for "now"."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str) and len(value) <= 64 and "T" in value.upper():
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValidationError.field(name, "must be an RFC 3339 date-time with a time zone") from None
    else:
        raise ValidationError.field(name, "must be an RFC 3339 date-time with a time zone")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValidationError.field(name, "must include a time zone (Z or an offset)")
    if not 1 <= parsed.year <= 9999:
        raise ValidationError.field(name, "is out of range")
    return parsed


def _alias(data: Mapping[str, Any], name: str, alias: str) -> Any:
    if data.get(name) is not None:
        return data.get(name)
    return data.get(alias)


def parse_task_spec(data: Any) -> TaskSpec:
    """Validate a producer's request. Accepts `queue_name` for `queue` and `scheduled_at` for `run_at`."""
    if not isinstance(data, Mapping):
        raise ValidationError("the request body must be a JSON object", {"body": ["must be a JSON object"]})
    task_name = _text("task_name", data.get("task_name"), required=True)
    queue = _text("queue", _alias(data, "queue", "queue_name"), required=True)
    assert task_name is not None and queue is not None
    if not QUEUE_RE.match(queue):
        raise ValidationError.field(
            "queue", "may contain only letters, digits, '_', '-', '.', ':' and must start with a letter or digit"
        )
    limit = valka_settings.MAX_PAYLOAD_BYTES
    payload = data.get("input")
    check_json("input", payload, limit)
    metadata = data.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise ValidationError.field("metadata", "must be a JSON object")
    check_json("metadata", metadata, limit)
    idempotency_key = _text("idempotency_key", data.get("idempotency_key"), required=False)
    return TaskSpec(
        task_name=task_name,
        queue=queue,
        input=payload,
        metadata=metadata,
        priority=_int("priority", data.get("priority"), 0, INT32_MIN, INT32_MAX),
        max_retries=_int("max_retries", data.get("max_retries"), valka_settings.MAX_RETRIES, 0, MAX_RETRIES_LIMIT),
        timeout_seconds=_int(
            "timeout_seconds", data.get("timeout_seconds"), valka_settings.DEFAULT_TIMEOUT_SECONDS, *TIMEOUT_RANGE
        ),
        idempotency_key=idempotency_key,
        run_at=parse_datetime("run_at", _alias(data, "run_at", "scheduled_at")),
    )
