"""Signals in the console: a read-only list, and the "send a signal" form of the task page.

Sending goes through `signals.services.signal_send`, the same function the API
and gRPC use, so the admin stores and announces a signal exactly as they do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html

from signals.models import Signal
from tasks.errors import ValkaError

SEND_PERMISSION = "signals.add_signal"


class OptionalJSONField(forms.JSONField):
    """A JSON textarea that starts empty (not "null"); empty means None."""

    def prepare_value(self, value: Any) -> Any:
        return "" if value is None else super().prepare_value(value)


class SignalSendForm(forms.Form):
    signal_type = forms.CharField(max_length=255, help_text="e.g. pause, resume, progress_request")
    payload = OptionalJSONField(required=False, help_text="Optional JSON.",
                                widget=forms.Textarea(attrs={"rows": 2, "cols": 50}))


def signal_sender() -> Callable[..., Any] | None:
    """`signals.services.signal_send`, or None while this build does not have it."""
    try:
        from signals import services
    except ImportError:
        return None
    return getattr(services, "signal_send", None)


def signal_send_view(request: HttpRequest, object_id: Any) -> HttpResponse:
    """POST from the task page; refused with 403 without `signals.add_signal`."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not request.user.has_perm(SEND_PERMISSION):
        raise PermissionDenied
    back = HttpResponseRedirect(reverse("admin:tasks_task_change", args=[object_id]) + "#signals")
    form = SignalSendForm(request.POST)
    if not form.is_valid():
        for field, errors in form.errors.items():
            messages.error(request, f"Signal not sent: {field}: {' '.join(errors)}")
        return back
    send = signal_sender()
    if send is None:
        messages.error(request, "Signal not sent: this build has no signals.services.signal_send yet.")
        return back
    try:
        result = send(task_id=object_id, signal_type=form.cleaned_data["signal_type"],
                      payload=form.cleaned_data["payload"])
    except ValkaError as exc:
        messages.error(request, f"Signal not sent: {exc.message}")
        return back
    signal = result[0] if isinstance(result, tuple) else result  # (signal, delivered)
    status = getattr(signal, "status", "")
    messages.success(request, f"Signal {form.cleaned_data['signal_type']!r} sent{f' ({status})' if status else ''}.")
    return back


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
        return format_html('<span class="vk-badge vk-{}">{}</span>', obj.status.lower(), obj.status)

    def has_add_permission(self, request: Any) -> bool:
        return False  # signals are sent from the task page, through the service layer

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False
