"""Response shapes (and request shapes for the OpenAPI schema).

Requests are validated by `tasks.specs`, shared with gRPC and the admin; the
request serializers here only document the fields.
"""

from datetime import datetime
from typing import Any

from django.utils import timezone
from rest_framework import serializers

from tasks.models import DeadLetter, Task, TaskLog, TaskRun, Worker
from tasks.services import MAX_BATCH
from tasks.specs import (
    INT32_MAX,
    INT32_MIN,
    LIMIT_RANGE,
    MAX_CONCURRENCY_KEY,
    MAX_DESCRIPTION,
    MAX_NAME,
    MAX_RETRIES_LIMIT,
    QUEUE_PATTERN,
    RATE_PERIOD_RANGE,
    TIMEOUT_RANGE,
)
from tasks.states import TaskStatus


class TaskSerializer(serializers.ModelSerializer):
    task_id = serializers.UUIDField(source="id", read_only=True)
    queue_name = serializers.CharField(source="queue", read_only=True)
    scheduled_at = serializers.DateTimeField(source="run_at", read_only=True)
    replayed_from_task_id = serializers.UUIDField(read_only=True, allow_null=True)
    replayed_from_dead_letter_id = serializers.UUIDField(read_only=True, allow_null=True)
    input = serializers.JSONField(allow_null=True)
    output = serializers.JSONField(allow_null=True)
    metadata = serializers.JSONField()

    class Meta:
        model = Task
        fields = [
            "id", "task_id", "task_name", "queue", "queue_name", "status", "priority", "max_retries",
            "attempt_count", "timeout_seconds", "idempotency_key", "input", "metadata", "output",
            "error_message", "run_at", "scheduled_at", "created_at", "updated_at", "started_at",
            "finished_at", "replayed_from_task_id", "replayed_from_dead_letter_id", "concurrency_key",
        ]
        read_only_fields = fields


class TaskData:
    """`TaskSerializer(task).data`, built directly: the create and batch endpoints answer with
    up to a thousand tasks, and building a ModelSerializer costs about a millisecond each.
    One instance serves a whole batch, whose tasks mostly share their times: each distinct
    time is formatted once. A test keeps the two equal."""

    def __init__(self) -> None:
        self.tz = timezone.get_current_timezone()
        self.texts: dict[datetime, str] = {}

    def when(self, value: datetime | None) -> str | None:
        if not value:
            return None
        text = self.texts.get(value)
        if text is None:
            text = value.astimezone(self.tz).isoformat()
            text = self.texts[value] = text[:-6] + "Z" if text.endswith("+00:00") else text
        return text

    def __call__(self, task: Task) -> dict[str, Any]:
        when = self.when
        task_id = str(task.id)
        run_at = when(task.run_at)
        created_at = when(task.created_at)
        # A new task's times are one object (and its start and finish None): no look-up for those.
        updated_at = created_at if task.updated_at is task.created_at else when(task.updated_at)
        return {
            "id": task_id, "task_id": task_id, "task_name": task.task_name, "queue": task.queue,
            "queue_name": task.queue, "status": task.status, "priority": task.priority,
            "max_retries": task.max_retries, "attempt_count": task.attempt_count,
            "timeout_seconds": task.timeout_seconds, "idempotency_key": task.idempotency_key,
            "input": task.input, "metadata": task.metadata, "output": task.output,
            "error_message": task.error_message, "run_at": run_at, "scheduled_at": run_at,
            "created_at": created_at, "updated_at": updated_at,
            "started_at": task.started_at and when(task.started_at),
            "finished_at": task.finished_at and when(task.finished_at),
            "replayed_from_task_id": _uuid_text(task.replayed_from_task_id),
            "replayed_from_dead_letter_id": _uuid_text(task.replayed_from_dead_letter_id),
            "concurrency_key": task.concurrency_key,
        }


def _uuid_text(value: Any) -> str | None:
    return None if value is None else str(value)


def task_data(task: Task) -> dict[str, Any]:
    """One task's `TaskData`."""
    return TaskData()(task)


class TaskCreateSerializer(serializers.Serializer):
    """Documents POST /api/v1/tasks. `queue_name` and `scheduled_at` are accepted as aliases."""

    task_name = serializers.CharField(max_length=MAX_NAME)
    queue = serializers.RegexField(QUEUE_PATTERN, max_length=MAX_NAME)
    input = serializers.JSONField(required=False, allow_null=True,
                                  help_text="Any JSON; no string in it may hold a NUL character.")
    metadata = serializers.DictField(required=False, help_text="A JSON object; no string in it may hold a NUL "
                                                               "character.")
    priority = serializers.IntegerField(required=False, min_value=INT32_MIN, max_value=INT32_MAX)
    max_retries = serializers.IntegerField(required=False, min_value=0, max_value=MAX_RETRIES_LIMIT)
    timeout_seconds = serializers.IntegerField(required=False, min_value=TIMEOUT_RANGE[0], max_value=TIMEOUT_RANGE[1])
    idempotency_key = serializers.CharField(required=False, allow_null=True, max_length=MAX_NAME)
    run_at = serializers.DateTimeField(required=False, allow_null=True)
    concurrency_key = serializers.CharField(
        required=False, allow_null=True, max_length=MAX_CONCURRENCY_KEY,
        help_text="Tasks of one key share their queue's max_running_per_key, and keys take turns.")
    queue_name = serializers.CharField(required=False, help_text="Alias of queue.")
    scheduled_at = serializers.DateTimeField(required=False, allow_null=True, help_text="Alias of run_at.")
    id = serializers.UUIDField(required=False, allow_null=True,
                               help_text="The task's id, made by the client (a UUIDv7 keeps the list's newest-first "
                                         "order). An id that exists answers that task (200) and creates nothing, so "
                                         "a retried request makes one task.")


class TaskBatchCreateSerializer(serializers.Serializer):
    """Documents POST /api/v1/tasks/batch: up to 1,000 tasks, each validated on its own."""

    tasks = TaskCreateSerializer(many=True, max_length=MAX_BATCH)


class TaskRunSerializer(serializers.ModelSerializer):
    task_id = serializers.UUIDField(read_only=True)
    run_id = serializers.UUIDField(source="id", read_only=True)
    output = serializers.JSONField(allow_null=True)

    class Meta:
        model = TaskRun
        fields = [
            "id", "run_id", "task_id", "attempt_number", "worker_id", "status", "output", "error_message",
            "lease_expires_at", "started_at", "finished_at", "last_heartbeat_at",
        ]
        read_only_fields = fields


class TaskLogSerializer(serializers.ModelSerializer):
    task_run_id = serializers.UUIDField(source="run_id", read_only=True)
    task_id = serializers.UUIDField(read_only=True)
    metadata = serializers.JSONField(allow_null=True)

    class Meta:
        model = TaskLog
        fields = ["id", "task_id", "task_run_id", "timestamp", "level", "message", "metadata"]
        read_only_fields = fields


class DeadLetterSerializer(serializers.ModelSerializer):
    task_id = serializers.UUIDField(read_only=True, allow_null=True)
    queue_name = serializers.CharField(source="queue", read_only=True)
    replay_task_id = serializers.UUIDField(read_only=True, allow_null=True)
    input = serializers.JSONField(allow_null=True)
    metadata = serializers.JSONField()

    class Meta:
        model = DeadLetter
        fields = [
            "id", "task_id", "task_name", "queue", "queue_name", "input", "metadata", "error_message",
            "attempt_count", "concurrency_key", "created_at", "replayed_at", "replay_task_id", "replay_count",
        ]
        read_only_fields = fields


class WorkerSerializer(serializers.ModelSerializer):
    worker_id = serializers.CharField(source="id", read_only=True)
    metadata = serializers.JSONField()
    queues = serializers.ListField(child=serializers.CharField())

    class Meta:
        model = Worker
        fields = [
            "id", "worker_id", "name", "queues", "concurrency", "status", "node_id", "metadata",
            "connected_at", "last_heartbeat_at", "disconnected_at",
        ]
        read_only_fields = fields


class QueueSerializer(serializers.Serializer):
    """A queue (`tasks.selectors.QueueView`): its settings and what it holds now."""

    name = serializers.CharField(source="queue.name")
    paused = serializers.BooleanField(help_text="Its pause is in force: it starts no task.")
    paused_until = serializers.DateTimeField(allow_null=True, help_text="When the pause ends by itself, if it does.")
    max_running = serializers.IntegerField(source="queue.max_running", allow_null=True)
    rate_limit = serializers.IntegerField(source="queue.rate_limit", allow_null=True)
    rate_period_seconds = serializers.IntegerField(source="queue.rate_period_seconds")
    max_running_per_key = serializers.IntegerField(source="queue.max_running_per_key", allow_null=True)
    description = serializers.CharField(source="queue.description")
    running = serializers.IntegerField(help_text="Its tasks DISPATCHING or RUNNING now (what max_running holds).")
    counts = serializers.DictField(child=serializers.IntegerField(),
                                   help_text="Its tasks by status, each counted up to 10,000 (see counts_exact).")
    counts_exact = serializers.BooleanField(help_text="false when a count stopped at 10,000")
    lag_seconds = serializers.FloatField(source="lag", allow_null=True,
                                         help_text="How long its oldest due PENDING task has waited.")
    updated_at = serializers.DateTimeField(source="queue.updated_at", allow_null=True)


class QueueChangeSerializer(serializers.Serializer):
    """Documents PATCH /api/v1/queues/{name}: the settings named change, the others stay."""

    max_running = serializers.IntegerField(required=False, allow_null=True, min_value=LIMIT_RANGE[0],
                                           help_text="Most of its tasks DISPATCHING or RUNNING at once; null: none.")
    rate_limit = serializers.IntegerField(required=False, allow_null=True, min_value=LIMIT_RANGE[0],
                                          help_text="Most of its tasks started per rate_period_seconds; null: none.")
    rate_period_seconds = serializers.IntegerField(required=False, min_value=RATE_PERIOD_RANGE[0],
                                                   max_value=RATE_PERIOD_RANGE[1])
    max_running_per_key = serializers.IntegerField(
        required=False, allow_null=True, min_value=LIMIT_RANGE[0],
        help_text="Most tasks of one concurrency_key running at once (keys take turns); null: no limit.")
    description = serializers.CharField(required=False, allow_blank=True, max_length=MAX_DESCRIPTION)


class QueuePauseSerializer(serializers.Serializer):
    """Documents POST /api/v1/queues/{name}/pause: the body may be empty."""

    until = serializers.DateTimeField(required=False, allow_null=True,
                                      help_text="The pause ends by itself then (in the future); none: until resumed.")


class ErrorSerializer(serializers.Serializer):
    error = serializers.CharField()
    message = serializers.CharField()
    details = serializers.DictField()


class TaskBatchResultSerializer(serializers.Serializer):
    """One item's outcome: `task` with 201 (created) or 200 (its idempotency key existed), else `error`."""

    status = serializers.IntegerField(help_text="201, 200, or the 4xx status of the error.")
    task = TaskSerializer(required=False)
    error = ErrorSerializer(required=False)


class TaskBatchResponseSerializer(serializers.Serializer):
    results = TaskBatchResultSerializer(many=True, help_text="One result per task sent, in the same order.")


STATUS_VALUES = [s.value for s in TaskStatus]
