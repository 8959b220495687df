"""The valka.v1 protocol as the dispatcher speaks it: its limits, the checks of what workers send,
and the conversions between our rows and the protocol's messages.

Everything a worker sends is checked here before the rest of the node sees it: a value
PostgreSQL would refuse must not reach the writer, whose whole batch it would fail. Workers
written with any Valka SDK connect, so nothing here trusts a field's form.
"""

from __future__ import annotations

import json
import math
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispatcher.session import InFlight
from tasks.errors import ValidationError, ValkaError
from tasks.models import Task, TaskLog
from tasks.specs import MAX_NAME, check_json, parse_json_text
from tasks.states import TaskStatus
from valka_sdk.v1 import common_pb2, events_pb2
from valka_sdk.v1 import worker_pb2 as pb
from valka_sdk.worker import INSTANCE_KEY

# -- Limits --
HELLO_TIMEOUT = 30.0  # seconds from the stream's start to its hello
MAX_QUEUES = 100  # queues one worker serves
MAX_CONCURRENCY = 1_000  # tasks one worker may hold at once (VALKA_MAX_WORKER_CONCURRENCY)
MAX_LOG_MESSAGE = 64 * 1024  # characters of a log line or an error message; longer ones are cut
MAX_MESSAGE = 16 * 1024 * 1024  # bytes of one gRPC message, either way: a bigger one ends the stream
# Bytes of a task's output (JSON text): over it, the run fails. Below MAX_MESSAGE with room to spare,
# so a result that carries one still fits in a message; the Python SDK refuses bigger outputs itself.
MAX_OUTPUT = 15 * 1024 * 1024
# valka.v1's CreateTaskRequest and TaskMeta have no field for a task's concurrency key: it travels
# in their metadata under this reserved key (proto/valka-v1.md), and is kept apart from the metadata.
CONCURRENCY_KEY = "valka.concurrency_key"

LEVELS = {
    common_pb2.LOG_LEVEL_DEBUG: "DEBUG", common_pb2.LOG_LEVEL_INFO: "INFO",
    common_pb2.LOG_LEVEL_WARN: "WARN", common_pb2.LOG_LEVEL_ERROR: "ERROR",
}
LOG_LEVELS = {text: level for level, text in LEVELS.items()}
TO_PROTO_STATUS = {s: getattr(common_pb2, f"TASK_STATUS_{s.value}") for s in TaskStatus}
FROM_PROTO_STATUS = {v: k for k, v in TO_PROTO_STATUS.items()}
_LATEST_MS = 253402300799000  # 9999-12-31T23:59:59Z


def valid_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
        return True
    except (ValueError, TypeError, AttributeError):
        return False


def _storable_float(literal: str) -> float:
    """A JSON number jsonb takes: finite, with an exponent and length far inside numeric's range."""
    value = float(literal)
    exponent = literal.lower().partition("e")[2]
    if not math.isfinite(value) or len(literal) > 1000 or (exponent and abs(int(exponent)) > 1000):
        raise ValueError(f"number {literal[:40]} is out of range")
    return value


def json_or_none(text: str) -> str | None:
    """`text` if it is JSON PostgreSQL can store under the producers' rules (tasks.specs.check_json:
    no NaN, NUL or lone surrogates, at most MAX_JSON_DEPTH levels), else None. A value PostgreSQL
    refused would fail the writer's whole batch, so it must not get that far."""
    if not text:
        return None
    try:
        check_json("output", parse_json_text(text, parse_float=_storable_float), sys.maxsize)
    except (ValueError, RecursionError, ValkaError):
        return None
    return text


def instance_of(metadata: str) -> str | None:
    """The worker process's own id from a hello's metadata (the SDK's INSTANCE_KEY), if any."""
    try:
        value = json.loads(metadata).get(INSTANCE_KEY) if metadata else None
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def hello_problem(hello: pb.WorkerHello, max_concurrency: int = MAX_CONCURRENCY) -> str | None:
    """Why a hello is refused (the stream ends INVALID_ARGUMENT with this), or None."""
    queues = [q for q in hello.queues if q]
    if not queues:
        return "hello.queues: at least one queue is required"
    if len(queues) > MAX_QUEUES or any(len(q) > MAX_NAME for q in queues):
        return f"hello.queues: at most {MAX_QUEUES} names of {MAX_NAME} characters"
    if hello.concurrency < 0 or hello.concurrency > max_concurrency:
        return f"hello.concurrency: must be between 1 and {max_concurrency}"
    if len(hello.worker_id) > MAX_NAME or len(hello.worker_name) > MAX_NAME:
        return f"hello.worker_id/worker_name: at most {MAX_NAME} characters"
    for name, values in (("queues", queues), ("worker_id", [hello.worker_id]), ("worker_name", [hello.worker_name])):
        if any("\x00" in v for v in values):
            return f"hello.{name}: must not contain NUL characters"
    return None


# -- What workers report, as the writer takes it --

@dataclass
class Result:
    run_id: str
    worker_id: str
    success: bool
    retryable: bool
    value: str | None  # output JSON when success, else the error message
    gate: InFlight | None  # the run's assignment on this node: written only once its start is


@dataclass
class LogLine:
    run_id: str
    ts_ms: int
    level: str
    message: str
    metadata: str | None
    gate: InFlight | None


def result_from(message: pb.TaskResult, worker_id: str, gate: InFlight | None) -> Result:
    """A worker's result as the writer takes it. An output that is not storable JSON, or over
    MAX_OUTPUT, fails the run with a message that says so instead."""
    run_id = message.task_run_id
    if not message.success:
        error = (message.error_message or "failed").replace("\x00", "")[:MAX_LOG_MESSAGE]
        return Result(run_id, worker_id, False, message.retryable, error, gate)
    output = json_or_none(message.output) if message.output else None
    if message.output and output is None:
        return Result(run_id, worker_id, False, False,
                      "the worker returned an output that is not valid JSON or not storable "
                      "(NaN, NUL, lone surrogates, nesting over 100 levels)", gate)
    if output is not None and len(output) > MAX_OUTPUT // 4 and (size := len(output.encode())) > MAX_OUTPUT:
        return Result(run_id, worker_id, False, False, f"output too large: {size} bytes, limit {MAX_OUTPUT}", gate)
    return Result(run_id, worker_id, True, False, output, gate)


def log_lines(batch: pb.LogBatch, held: Mapping[str, InFlight]) -> list[LogLine]:
    """The lines of `batch` that belong to runs in `held` (a worker cannot write into another's run)."""
    lines = []
    now_ms = int(time.time() * 1000)
    for e in batch.entries:
        gate = held.get(e.task_run_id)
        if gate is None:
            continue
        lines.append(LogLine(
            run_id=e.task_run_id,
            ts_ms=e.timestamp_ms if 0 < e.timestamp_ms < _LATEST_MS else now_ms,
            level=LEVELS.get(e.level, "INFO"),
            message=e.message.replace("\x00", "")[:MAX_LOG_MESSAGE],
            metadata=json_or_none(e.metadata),
            gate=gate,
        ))
    return lines


# -- What the dispatcher sends workers --

def assignment(entry: InFlight, *, task_name: str, payload: str | None, metadata: str | None,
               timeout_seconds: int) -> pb.WorkerResponse:
    return pb.WorkerResponse(task_assignment=pb.TaskAssignment(
        task_id=entry.task_id, task_run_id=entry.run_id, queue_name=entry.queue, task_name=task_name,
        input=payload or "", attempt_number=entry.attempt, timeout_seconds=timeout_seconds,
        metadata=metadata or "{}",
    ))


def cancellation(task_id: str, reason: str) -> pb.WorkerResponse:
    return pb.WorkerResponse(task_cancellation=pb.TaskCancellation(task_id=task_id, reason=reason))


def signal(signal_id: Any, task_id: Any, signal_type: str, payload: str | None,
           created_at: datetime | None) -> pb.WorkerResponse:
    return pb.WorkerResponse(task_signal=pb.TaskSignal(
        signal_id=str(signal_id), task_id=str(task_id), signal_name=signal_type, payload=payload or "",
        timestamp_ms=int(created_at.timestamp() * 1000) if created_at else int(time.time() * 1000),
    ))


def heartbeat_ack() -> pb.WorkerResponse:
    return pb.WorkerResponse(heartbeat_ack=pb.HeartbeatAck(server_timestamp_ms=int(time.time() * 1000)))


def server_shutdown(reason: str, drain_seconds: float) -> pb.WorkerResponse:
    return pb.WorkerResponse(server_shutdown=pb.ServerShutdown(reason=reason, drain_seconds=int(drain_seconds)))


# -- ApiService: requests in, rows out --

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


def split_concurrency_key(metadata: Any) -> tuple[Any, Any]:
    """(the metadata without the reserved concurrency key, the key) of a CreateTaskRequest."""
    if isinstance(metadata, dict) and CONCURRENCY_KEY in metadata:
        metadata = dict(metadata)
        return metadata, metadata.pop(CONCURRENCY_KEY)
    return metadata, None


def task_meta(task: Task) -> common_pb2.TaskMeta:
    metadata = task.metadata if task.metadata is not None else {}
    if task.concurrency_key is not None:
        metadata = {**metadata, CONCURRENCY_KEY: task.concurrency_key}
    return common_pb2.TaskMeta(
        id=str(task.id), queue_name=task.queue, task_name=task.task_name,
        status=TO_PROTO_STATUS[TaskStatus(task.status)], priority=task.priority, max_retries=task.max_retries,
        attempt_count=task.attempt_count, timeout_seconds=task.timeout_seconds,
        idempotency_key=task.idempotency_key or "", input=dump_json(task.input),
        metadata=dump_json(metadata), output=dump_json(task.output),
        error_message=task.error_message or "", scheduled_at=rfc3339(task.run_at),
        created_at=rfc3339(task.created_at), updated_at=rfc3339(task.updated_at),
    )


def _status(name: str | None) -> int:
    try:
        return TO_PROTO_STATUS[TaskStatus(name)] if name else common_pb2.TASK_STATUS_UNSPECIFIED
    except ValueError:
        return common_pb2.TASK_STATUS_UNSPECIFIED


def task_event(event: dict[str, Any]) -> events_pb2.TaskEvent:
    """An event as the task event triggers announce it (tasks/sql/schema/events.sql)."""
    return events_pb2.TaskEvent(
        event_id=str(event.get("event_id", "")), task_id=str(event.get("task_id", "")),
        queue_name=event.get("queue_name") or "", previous_status=_status(event.get("previous_status")),
        new_status=_status(event.get("new_status")), worker_id=event.get("worker_id") or "",
        node_id=event.get("node_id") or "", attempt_number=int(event.get("attempt_number") or 0),
        error_message=event.get("error_message") or "", timestamp_ms=int(event.get("timestamp_ms") or 0),
    )


def log_entry(line: TaskLog) -> pb.LogEntry:
    return pb.LogEntry(
        task_run_id=str(line.run_id), timestamp_ms=int(line.timestamp.timestamp() * 1000),
        level=LOG_LEVELS.get(line.level, common_pb2.LOG_LEVEL_INFO), message=line.message,
        metadata=dump_json(line.metadata),
    )
