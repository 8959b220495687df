"""Signals in the console: a read-only list, and the task page's signals with its "send a signal" form.

The task page is the tasks app's (tasks.admin.tasks.TaskAdmin); this app registers it again
with its signals added, so tasks knows nothing of signals. Sending goes through
`signals.services.signal_send`, the same function the API and gRPC use, so the admin stores
and announces a signal exactly as they do; it needs `signals.add_signal` (else a 403).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from signals import services
from signals.models import Signal
from signals.permissions import SEND_SIGNALS
from tasks.admin.console import OptionalJSONField, badge
from tasks.admin.tasks import TaskAdmin
from tasks.errors import ValkaError
from tasks.models import Task
from tasks.specs import MAX_NAME
from tasks.states import FINAL_STATES

SEND_PERMISSION = SEND_SIGNALS.permission
SIGNALS_PER_TASK_PAGE = 200


class SignalSendForm(forms.Form):
    signal_type = forms.CharField(max_length=MAX_NAME, help_text="e.g. pause, resume, progress_request")
    payload = OptionalJSONField(required=False, help_text="Optional JSON.",
                                widget=forms.Textarea(attrs={"rows": 2, "cols": 50}))


class TaskWithSignalsAdmin(TaskAdmin):
    """The task page with the task's signals and, for users who may send one, the form."""

    detail_template = "admin/signals/task_detail.html"

    def get_urls(self) -> list:
        view = self.admin_site.admin_view(require_POST(self.signal_view))
        return [path("<uuid:object_id>/signal/", view, name="tasks_task_signal"), *super().get_urls()]

    def detail_context(self, request: HttpRequest, task: Task) -> dict[str, Any]:
        return {
            **super().detail_context(request, task),
            "signals": list(Signal.objects.filter(task_id=task.id).order_by("id")[:SIGNALS_PER_TASK_PAGE]),
            "can_signal": task.status not in FINAL_STATES and request.user.has_perm(SEND_PERMISSION),
            "signal_form": SignalSendForm(),
        }

    def signal_view(self, request: HttpRequest, object_id: Any) -> HttpResponse:
        """POST from the task page; refused with 403 without `signals.add_signal`."""
        if not request.user.has_perm(SEND_PERMISSION):
            raise PermissionDenied
        back = HttpResponseRedirect(reverse("admin:tasks_task_change", args=[object_id]) + "#signals")
        form = SignalSendForm(request.POST)
        if not form.is_valid():
            for field, errors in form.errors.items():
                messages.error(request, f"Signal not sent: {field}: {' '.join(errors)}")
            return back
        try:
            signal, _delivered = services.signal_send(task_id=object_id, signal_type=form.cleaned_data["signal_type"],
                                                      payload=form.cleaned_data["payload"])
        except ValkaError as exc:
            messages.error(request, f"Signal not sent: {exc.message}")
            return back
        messages.success(request, f"Signal {form.cleaned_data['signal_type']!r} sent ({signal.status}).")
        return back


admin.site.unregister(Task)
admin.site.register(Task, TaskWithSignalsAdmin)


@admin.register(Signal)
class SignalAdmin(admin.ModelAdmin):
    list_display = ["id", "task_link", "signal_type", "status_badge", "created_at", "delivered_at", "acknowledged_at"]
    list_filter = ["status", "signal_type"]
    search_fields = ["=id", "=task__id", "=signal_type"]
    show_full_result_count = False
    ordering = ["-id"]

    @admin.display(description="task")
    def task_link(self, obj: Signal) -> str:
        return format_html('<a href="{}">{}</a>', reverse("admin:tasks_task_change", args=[obj.task_id]), obj.task_id)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Signal) -> str:
        return badge(obj.status)

    def has_add_permission(self, request: Any) -> bool:
        return False  # signals are sent from the task page, through the service layer

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False
