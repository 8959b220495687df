"""The admin registers every table read-only where the machine owns the data:
a person must not be able to move a task past the state machine from a form.
Actions go through `tasks.services`, like the API.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages

from tasks import services
from tasks.errors import ValkaError
from tasks.models import ApiKey, DeadLetter, Task, TaskLog, TaskRun, Worker


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


class TaskRunInline(admin.TabularInline):
    model = TaskRun
    extra = 0
    can_delete = False
    fields = ["attempt_number", "worker_id", "status", "started_at", "finished_at", "lease_expires_at",
              "error_message"]
    readonly_fields = fields
    ordering = ["attempt_number"]

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ["id", "task_name", "queue", "status", "priority", "attempt_count", "max_retries",
                    "created_at", "finished_at"]
    list_filter = ["status", "queue", "task_name", "created_at"]
    search_fields = ["=id", "task_name", "=idempotency_key"]
    ordering = ["-created_at"]
    show_full_result_count = False
    inlines = [TaskRunInline]
    actions = ["cancel_selected"]

    def get_readonly_fields(self, request: Any, obj: Any = None) -> list[str]:
        return [f.name for f in Task._meta.fields]

    @admin.action(description="Cancel selected tasks", permissions=["change"])
    def cancel_selected(self, request: Any, queryset: Any) -> None:
        done, refused = 0, []
        for task_id in queryset.values_list("id", flat=True):
            try:
                services.task_cancel(task_id=task_id)
                done += 1
            except ValkaError as exc:
                refused.append(exc.message)
        if done:
            self.message_user(request, f"Cancelled {done} task(s).", messages.SUCCESS)
        for message in refused[:10]:
            self.message_user(request, message, messages.WARNING)

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        # Change permission gates the actions; the form itself stays read-only.
        return request.user.has_perm("tasks.change_task") if obj is None else False


@admin.register(TaskRun)
class TaskRunAdmin(ReadOnlyAdmin):
    list_display = ["id", "task", "attempt_number", "worker_id", "status", "started_at", "finished_at"]
    list_filter = ["status"]
    search_fields = ["=id", "=task__id", "worker_id"]
    show_full_result_count = False


@admin.register(TaskLog)
class TaskLogAdmin(ReadOnlyAdmin):
    list_display = ["id", "task", "run", "timestamp", "level", "message"]
    list_filter = ["level"]
    search_fields = ["=task__id", "message"]
    show_full_result_count = False


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = ["id", "task_name", "queue", "attempt_count", "error_message", "created_at", "replayed_at",
                    "replay_task"]
    list_filter = ["queue", "task_name", "created_at"]
    search_fields = ["=id", "task_name", "error_message"]
    actions = ["replay_selected"]

    @admin.action(description="Replay selected dead letters", permissions=["change"])
    def replay_selected(self, request: Any, queryset: Any) -> None:
        created = 0
        for letter_id in queryset.values_list("id", flat=True):
            try:
                services.dead_letter_replay(dead_letter_id=letter_id)
                created += 1
            except ValkaError as exc:
                self.message_user(request, exc.message, messages.WARNING)
        self.message_user(request, f"Replayed {created} dead letter(s) as new tasks.", messages.SUCCESS)

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return request.user.has_perm("tasks.change_deadletter") if obj is None else False


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ["id", "name", "status", "queues", "concurrency", "node_id", "connected_at",
                    "last_heartbeat_at"]
    list_filter = ["status", "node_id"]
    search_fields = ["=id", "name"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "created_at", "last_used_at", "revoked"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
    list_filter = ["revoked"]
    search_fields = ["name", "prefix"]

    def has_add_permission(self, request: Any) -> bool:
        return False  # keys are created with `manage.py create_api_key`, which shows the key once
