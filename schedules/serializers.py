"""The REST API's shapes of a schedule. Requests are validated by `schedules.specs` (shared with
the admin and VALKA_SCHEDULES); the request serializers here only document the fields."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from schedules.models import MAX_SCHEDULE_NAME, CatchUp, Schedule
from schedules.selectors import schedule_upcoming
from schedules.specs import MAX_INTERVAL
from tasks.models import Task
from tasks.specs import INT32_MAX, INT32_MIN, MAX_NAME, MAX_RETRIES_LIMIT, QUEUE_PATTERN, TIMEOUT_RANGE


class ScheduleSerializer(serializers.ModelSerializer):
    input = serializers.JSONField(allow_null=True)
    metadata = serializers.JSONField()
    last_task_id = serializers.UUIDField(read_only=True, allow_null=True)
    last_task_status = serializers.SerializerMethodField()
    upcoming = serializers.SerializerMethodField()

    class Meta:
        model = Schedule
        fields = [
            "name", "cron", "interval_seconds", "timezone", "catch_up", "enabled", "start_at", "end_at",
            "declared", "task_name", "queue", "input", "metadata", "priority", "max_retries", "timeout_seconds",
            "next_run_at", "upcoming", "last_run_at", "last_task_id", "last_task_status", "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_last_task_status(self, schedule: Schedule) -> str | None:
        """The last task's status; null when it has none, or retention has deleted it."""
        if schedule.last_task_id is None:
            return None
        try:
            return schedule.last_task.status if schedule.last_task is not None else None
        except Task.DoesNotExist:
            return None

    @extend_schema_field(serializers.ListField(child=serializers.DateTimeField()))
    def get_upcoming(self, schedule: Schedule) -> list[str]:
        """The next five slots from now (empty past end_at)."""
        field = serializers.DateTimeField()
        return [field.to_representation(slot) for slot in schedule_upcoming(schedule, now=self._now())]

    def _now(self) -> datetime:
        return self.context.get("now") or timezone.now()


class ScheduleCreateSerializer(serializers.Serializer):
    """Documents POST /api/v1/schedules: the schedule's fields and, flat beside them, those of the
    task it creates (as in POST /api/v1/tasks). Exactly one of `cron` and `interval_seconds`."""

    name = serializers.RegexField(QUEUE_PATTERN, max_length=MAX_SCHEDULE_NAME)
    cron = serializers.CharField(required=False, allow_null=True, max_length=MAX_NAME,
                                 help_text="5 fields (minute hour day-of-month month day-of-week) or @hourly, "
                                           "@daily, @weekly, @monthly, @yearly")
    interval_seconds = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_INTERVAL)
    timezone = serializers.CharField(required=False, help_text="IANA name (default UTC); cron slots follow its "
                                                               "wall-clock time")
    catch_up = serializers.ChoiceField(choices=CatchUp.choices, required=False,
                                       help_text="After downtime: latest (default), none or all (at most 100)")
    enabled = serializers.BooleanField(required=False)
    start_at = serializers.DateTimeField(required=False, allow_null=True)
    end_at = serializers.DateTimeField(required=False, allow_null=True)
    task_name = serializers.CharField(max_length=MAX_NAME)
    queue = serializers.RegexField(QUEUE_PATTERN, max_length=MAX_NAME)
    input = serializers.JSONField(required=False, allow_null=True)
    metadata = serializers.DictField(required=False, help_text="A JSON object; the key valka.schedule is reserved")
    priority = serializers.IntegerField(required=False, min_value=INT32_MIN, max_value=INT32_MAX)
    max_retries = serializers.IntegerField(required=False, min_value=0, max_value=MAX_RETRIES_LIMIT)
    timeout_seconds = serializers.IntegerField(required=False, min_value=TIMEOUT_RANGE[0], max_value=TIMEOUT_RANGE[1])


class ScheduleUpdateSerializer(ScheduleCreateSerializer):
    """Documents PATCH /api/v1/schedules/{name}: any of the fields; the result is validated whole."""

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        for field in fields.values():
            field.required = False
        return fields
