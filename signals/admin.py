from typing import Any

from django.contrib import admin

from signals.models import Signal


@admin.register(Signal)
class SignalAdmin(admin.ModelAdmin):
    list_display = ["id", "task", "signal_type", "status", "created_at", "delivered_at", "acknowledged_at"]
    list_filter = ["status", "signal_type"]
    search_fields = ["=id", "=task__id", "signal_type"]
    show_full_result_count = False

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False
