"""Workers and their runs in the console: read-only lists of what the dispatchers record."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.utils.timesince import timesince

from tasks.admin.console import ConsoleAdmin, badge
from tasks.models import TaskRun, Worker


@admin.register(Worker)
class WorkerAdmin(ConsoleAdmin):
    list_display = ["name_or_id", "status_badge", "queue_list", "concurrency", "in_flight", "free_slots",
                    "heartbeat", "connected_at", "node_id", "disconnected_at"]
    list_filter = ["status", "node_id"]
    search_fields = ["name"]  # see search_by_text: exact id or name
    ordering = ["status", "-connected_at"]

    def get_queryset(self, request: Any) -> QuerySet:
        running = (TaskRun.objects.filter(worker_id=OuterRef("id"), finished_at__isnull=True, status="RUNNING")
                   .order_by().values("worker_id").annotate(n=Count("*")).values("n"))
        return super().get_queryset(request).annotate(running=Subquery(running, output_field=IntegerField()))

    def get_search_results(self, request: Any, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        return (queryset.filter(Q(id=term) | Q(name=term)) if term else queryset), False

    @admin.display(description="worker", ordering="name")
    def name_or_id(self, obj: Worker) -> str:
        return obj.name or obj.id

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Worker) -> str:
        return badge(obj.status)

    @admin.display(description="queues")
    def queue_list(self, obj: Worker) -> str:
        return ", ".join(obj.queues)

    @admin.display(description="in flight")
    def in_flight(self, obj: Worker) -> int:
        return obj.running or 0

    @admin.display(description="free slots")
    def free_slots(self, obj: Worker) -> int | str:
        return max(obj.concurrency - (obj.running or 0), 0) if obj.status == Worker.Status.CONNECTED else "—"

    @admin.display(description="last heartbeat", ordering="last_heartbeat_at")
    def heartbeat(self, obj: Worker) -> str:
        return f"{timesince(obj.last_heartbeat_at)} ago"


@admin.register(TaskRun)
class TaskRunAdmin(ConsoleAdmin):
    list_display = ["id", "task_id", "attempt_number", "worker_id", "status", "started_at", "finished_at"]
    list_filter = ["status"]
    search_fields = ["worker_id"]  # see search_by_text
    ordering = ["-id"]

    def search_by_id(self, value: uuid.UUID) -> Q:
        return Q(pk=value) | Q(task_id=value)

    def search_by_text(self, term: str) -> Q:
        return Q(worker_id=term)
