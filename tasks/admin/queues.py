"""The console's Queues page: every queue with its tasks by status, lag, what runs against its limit,
its rate and its pause, with pause and resume (`tasks.pause_queue`) and a form for the limits
(`tasks.change_queue`), each through the same service function as the REST API."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from tasks import dashboard, selectors, services
from tasks.admin.console import ConsoleAdmin
from tasks.errors import ValkaError
from tasks.models import Queue
from tasks.specs import LIMIT_RANGE, MAX_DESCRIPTION, RATE_PERIOD_RANGE
from tasks.states import TaskStatus

LIMIT_HELP = {
    "max_running": "Most of its tasks DISPATCHING or RUNNING at once, across every worker. Empty: no limit.",
    "rate_limit": "Most of its tasks started per period, across every worker. Empty: no limit.",
    "max_running_per_key": "Most tasks of one concurrency key running at once; keys take turns. Empty: no limit.",
}


class QueueLimitsForm(forms.Form):
    max_running = forms.IntegerField(required=False, min_value=LIMIT_RANGE[0], help_text=LIMIT_HELP["max_running"])
    rate_limit = forms.IntegerField(required=False, min_value=LIMIT_RANGE[0], help_text=LIMIT_HELP["rate_limit"])
    rate_period_seconds = forms.IntegerField(min_value=RATE_PERIOD_RANGE[0], max_value=RATE_PERIOD_RANGE[1],
                                             help_text="The rate limit's period, in seconds.")
    max_running_per_key = forms.IntegerField(required=False, min_value=LIMIT_RANGE[0],
                                             help_text=LIMIT_HELP["max_running_per_key"])
    description = forms.CharField(required=False, max_length=MAX_DESCRIPTION,
                                  widget=forms.Textarea(attrs={"rows": 2, "cols": 70}))


class QueuePauseForm(forms.Form):
    until = forms.DateTimeField(required=False, help_text="UTC, e.g. 2030-01-31 12:00; empty: until resumed.",
                                widget=forms.DateTimeInput(attrs={"placeholder": "until (UTC), optional"}))


@admin.register(Queue)
class QueueAdmin(ConsoleAdmin):
    """Not a model list: one table of every queue (selectors.queue_list), rows or not."""

    def has_pause_permission(self, request: Any) -> bool:
        return request.user.has_perm("tasks.pause_queue")

    def has_limits_permission(self, request: Any) -> bool:
        return request.user.has_perm("tasks.change_queue")

    def get_urls(self) -> list:
        view = self.admin_site.admin_view
        return [
            path("<str:name>/pause/", view(require_POST(self.pause_view)), name="tasks_queue_pause"),
            path("<str:name>/resume/", view(require_POST(self.resume_view)), name="tasks_queue_resume"),
            path("<str:name>/limits/", view(self.limits_view), name="tasks_queue_limits"),
            *super().get_urls(),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        rows = [{"view": view, "limits": dashboard.limits_text(
                     max_running=view.queue.max_running, rate_limit=view.queue.rate_limit,
                     rate_period_seconds=view.queue.rate_period_seconds,
                     max_running_per_key=view.queue.max_running_per_key),
                 "cells": [view.counts[s] for s in ("PENDING", "DISPATCHING", "RUNNING", "RETRY")],
                 "lag": dashboard.age(view.lag)}
                for view in selectors.queue_list()]
        return TemplateResponse(request, "admin/tasks/queue/list.html", {
            **self.admin_site.each_context(request), "opts": self.opts, "title": "Queues", "rows": rows,
            "statuses": [TaskStatus.PENDING, TaskStatus.DISPATCHING, TaskStatus.RUNNING, TaskStatus.RETRY],
            "can_pause": self.has_pause_permission(request), "can_change": self.has_limits_permission(request),
            "pause_form": QueuePauseForm(), "cap": dashboard.COUNT_CAP,
        })

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict | None = None) -> HttpResponse:
        return HttpResponseRedirect(reverse("admin:tasks_queue_limits", args=[object_id]))

    def pause_view(self, request: HttpRequest, name: str) -> HttpResponse:
        if not self.has_pause_permission(request):
            raise PermissionDenied
        form = QueuePauseForm(request.POST)
        if not form.is_valid():
            self.message_user(request, f"Not paused: {form.errors.as_text()}", messages.ERROR)
        else:
            until = form.cleaned_data["until"]
            self._act(request, name, lambda: services.queue_pause_from_data(
                name=name, data={"until": until.isoformat()} if until else None),
                f"Queue {name} paused{f' until {until:%Y-%m-%d %H:%M} UTC' if until else ''}.")
        return HttpResponseRedirect(reverse("admin:tasks_queue_changelist"))

    def resume_view(self, request: HttpRequest, name: str) -> HttpResponse:
        if not self.has_pause_permission(request):
            raise PermissionDenied
        self._act(request, name, lambda: services.queue_resume(name=name), f"Queue {name} resumed.")
        return HttpResponseRedirect(reverse("admin:tasks_queue_changelist"))

    def _act(self, request: HttpRequest, name: str, action: Any, done: str) -> None:
        try:
            queue = action()
        except ValkaError as exc:
            self.message_user(request, exc.message, messages.ERROR)
        else:
            self.log_change(request, queue, done)
            self.message_user(request, done, messages.SUCCESS)

    def limits_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """The limits form: shown to whoever may view queues, saved only with `tasks.change_queue`."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST" and not self.has_limits_permission(request):
            raise PermissionDenied
        try:
            view = selectors.queue_get(name=name)
        except ValkaError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return HttpResponseRedirect(reverse("admin:tasks_queue_changelist"))
        current = {field: getattr(view.queue, field) for field in QueueLimitsForm.base_fields}
        form = QueueLimitsForm(request.POST if request.method == "POST" else None, initial=current)
        if request.method == "POST" and form.is_valid():
            # What changed; an emptied limit is None: no limit.
            changes = {field: value for field, value in form.cleaned_data.items() if value != current[field]}
            try:
                queue = services.queue_update(name=name, data=changes)
            except ValkaError as exc:
                for field, problems in exc.details.items():
                    form.add_error(field if field in form.fields else None, problems)
            else:
                self.log_change(request, queue, f"Limits: {changes}")
                self.message_user(request, f"Queue {name}: limits saved.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:tasks_queue_changelist"))
        return TemplateResponse(request, "admin/tasks/queue/limits.html", {
            **self.admin_site.each_context(request), "opts": self.opts, "title": f"Limits of {name}",
            "form": form, "view": view, "can_change": self.has_limits_permission(request),
            "read_only": not self.has_limits_permission(request),
        })
