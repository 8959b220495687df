"""List filters whose choices come from index probes, never from a scan of the table."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet

from tasks import dashboard


class IndexedDistinctFilter(admin.SimpleListFilter):
    """Choices from a loose index scan: Django's default would SELECT DISTINCT over every row."""

    table = "tasks"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [(v, v) for v in dashboard.distinct_values(table=self.table, column=self.parameter_name)]

    def queryset(self, request: Any, queryset: QuerySet) -> QuerySet:
        return queryset.filter(**{self.parameter_name: self.value()}) if self.value() else queryset


class QueueFilter(IndexedDistinctFilter):
    title = parameter_name = "queue"


class TaskNameFilter(IndexedDistinctFilter):
    title, parameter_name = "task name", "task_name"


class DeadLetterQueueFilter(QueueFilter):
    table = "dead_letter_queue"


class ReplayedFilter(admin.SimpleListFilter):
    title = parameter_name = "replayed"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [("no", "Not replayed"), ("yes", "Replayed")]

    def queryset(self, request: Any, queryset: QuerySet) -> QuerySet:
        if self.value() in ("yes", "no"):
            return queryset.filter(replayed_at__isnull=self.value() == "no")
        return queryset
