"""The console's task pages: the list, a task's own page, and cancel, replay and create.

Each action calls the same service function as the REST API and is gated by its own
permission (`tasks.cancel_task`, `tasks.replay_task`, `tasks.add_task`). Other apps add facts
to a task's page from their `AppConfig.ready()` (`DETAIL_FACTS`), so tasks imports none of them."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from tasks import services
from tasks.admin.console import ConsoleAdmin, OptionalJSONField, badge, pretty_json, runs_with_logs, span
from tasks.admin.filters import QueueFilter, TaskNameFilter
from tasks.errors import ValkaError
from tasks.models import DeadLetter, Task
from tasks.specs import MAX_CONCURRENCY_KEY, MAX_NAME
from tasks.states import REPLAYABLE, TaskStatus, sources_of
from valka_sdk import tracing

CANCELLABLE = frozenset(sources_of(TaskStatus.CANCELLED))

# Each takes a task and answers (label, HTML) pairs for its page, built with format_html: where it
# came from, say. Registered once each with `add_detail_facts`.
DetailFacts = Callable[[Task], list[tuple[str, str]]]
DETAIL_FACTS: list[DetailFacts] = []


def add_detail_facts(facts: DetailFacts) -> None:
    if facts not in DETAIL_FACTS:
        DETAIL_FACTS.append(facts)


class TaskCreateForm(forms.Form):
    task_name = forms.CharField(max_length=MAX_NAME)
    queue = forms.CharField(max_length=MAX_NAME, initial="default")
    input = OptionalJSONField(required=False, widget=forms.Textarea(attrs={"rows": 6, "cols": 70}),
                              help_text="JSON; empty means null.")
    metadata = OptionalJSONField(required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
                                 help_text="A JSON object.")
    priority = forms.IntegerField(required=False, help_text="Higher runs first; default 0.")
    max_retries = forms.IntegerField(required=False)
    timeout_seconds = forms.IntegerField(required=False)
    idempotency_key = forms.CharField(max_length=MAX_NAME, required=False,
                                      help_text="A second task with the same key is not created.")
    run_at = forms.DateTimeField(required=False, help_text="UTC, e.g. 2030-01-31 12:00; empty means now.")
    concurrency_key = forms.CharField(max_length=MAX_CONCURRENCY_KEY, required=False,
                                      help_text="Tasks of one key share the queue's limit per key.")


@admin.register(Task)
class TaskAdmin(ConsoleAdmin):
    list_display = ["task", "task_name", "queue", "status_badge", "attempts", "priority", "created_at", "finished_at"]
    list_filter = ["status", QueueFilter, TaskNameFilter, "created_at"]
    search_fields = ["task_name"]  # see search_by_text: id, exact task_name or idempotency key
    search_help_text = "Task id, exact task name, or idempotency key."
    sortable_by = ["task", "created_at"]
    ordering = ["-id"]  # UUIDv7: newest first, along the primary key
    actions = ["cancel_selected", "replay_selected"]
    detail_template = "admin/tasks/task/detail.html"

    def has_add_permission(self, request: Any) -> bool:
        return request.user.has_perm("tasks.add_task")

    def has_cancel_permission(self, request: Any) -> bool:
        return request.user.has_perm("tasks.cancel_task")

    def has_replay_permission(self, request: Any) -> bool:
        return request.user.has_perm("tasks.replay_task")

    def search_by_text(self, term: str) -> Q:
        return Q(task_name=term) | Q(idempotency_key=term)

    @admin.display(description="task", ordering="id")
    def task(self, obj: Task) -> str:
        return str(obj.id)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Task) -> str:
        return badge(obj.status)

    @admin.display(description="attempts")
    def attempts(self, obj: Task) -> str:
        return f"{obj.attempt_count}/{obj.max_retries + 1}"

    def get_urls(self) -> list:
        view = self.admin_site.admin_view
        return [
            path("<uuid:object_id>/cancel/", view(require_POST(self.cancel_view)), name="tasks_task_cancel"),
            path("<uuid:object_id>/replay/", view(require_POST(self.replay_view)), name="tasks_task_replay"),
            path("events/", view(self.events_view), name="valka_events"),
            *super().get_urls(),
        ]

    def events_view(self, request: HttpRequest) -> HttpResponse:
        """Live task events: the page subscribes to the SSE stream `/api/v1/events` (staff session)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {**self.admin_site.each_context(request), "title": "Live events",
                   "queue": request.GET.get("queue", "")}
        return TemplateResponse(request, "admin/valka/events.html", context)

    def detail_context(self, request: HttpRequest, task: Task) -> dict[str, Any]:
        runs = runs_with_logs(task.id)
        return {
            "badge": badge(task.status), "runs": runs,
            "live_run": next((r for r in runs if r.status == "RUNNING"), None),
            "input_json": pretty_json(task.input), "output_json": pretty_json(task.output),
            "metadata_json": pretty_json(task.metadata), "trace": tracing.ids_of(task.metadata),
            "replays": list(Task.objects.filter(replayed_from_task_id=task.id).order_by("id")[:50]),
            "dead_letter": DeadLetter.objects.filter(task_id=task.id).first(),
            "waited": span(task.run_at, task.started_at),
            "ran": span(task.started_at, task.finished_at or timezone.now()),
            "can_cancel": task.status in CANCELLABLE and self.has_cancel_permission(request),
            "can_replay": task.status in REPLAYABLE and self.has_replay_permission(request),
            "more_facts": [fact for facts in DETAIL_FACTS for fact in facts(task)],
        }

    def cancel_view(self, request: HttpRequest, object_id: uuid.UUID) -> HttpResponse:
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        try:
            task = services.task_cancel(task_id=object_id, reason=f"cancelled from the admin by {request.user}")
        except ValkaError as exc:
            self.message_user(request, exc.message, messages.ERROR)
        else:
            self.log_change(request, task, "Cancelled")
            self.message_user(request, "Task cancelled.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:tasks_task_change", args=[object_id]))

    def replay_view(self, request: HttpRequest, object_id: uuid.UUID) -> HttpResponse:
        if not self.has_replay_permission(request):
            raise PermissionDenied
        try:
            new = services.task_replay(task_id=object_id)
        except ValkaError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return HttpResponseRedirect(reverse("admin:tasks_task_change", args=[object_id]))
        self.log_addition(request, new, f"Replay of {object_id}")
        self.message_user(request, f"Replayed as a new task {new.id}.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:tasks_task_change", args=[new.id]))

    @admin.action(description="Cancel selected tasks", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.bulk(request, queryset, action="cancel_selected", verb="Cancel", done_verb="Cancelled",
                         apply=lambda task_id: services.task_cancel(task_id=task_id, reason="cancelled from the admin"))

    @admin.action(description="Replay selected tasks (DEAD_LETTER, FAILED, CANCELLED)", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.bulk(request, queryset, action="replay_selected", verb="Replay", done_verb="Replayed",
                         apply=lambda task_id: services.task_replay(task_id=task_id))

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: dict | None = None) -> HttpResponse:
        """Create a task through `services.task_create_from_data`: the API's validation and idempotency."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = TaskCreateForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = {k: v for k, v in form.cleaned_data.items() if v not in (None, "")}
            data["input"] = form.cleaned_data["input"]
            try:
                task, created = services.task_create_from_data(data=data)
            except ValkaError as exc:
                for field, problems in exc.details.items():
                    form.add_error(field if field in form.fields else None, problems)
                if not exc.details:
                    form.add_error(None, exc.message)
            else:
                if created:
                    self.log_addition(request, task, "Created from the admin")
                    self.message_user(request, f"Task {task.id} created.", messages.SUCCESS)
                else:
                    self.message_user(request, "A task with this idempotency key exists already: here it is.",
                                      messages.WARNING)
                return HttpResponseRedirect(reverse("admin:tasks_task_change", args=[task.id]))
        return TemplateResponse(request, "admin/tasks/task/create.html", {
            **self.admin_site.each_context(request), "opts": self.opts, "title": "Create a task", "form": form,
        })
