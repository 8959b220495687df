"""The Django admin is Valka's console: an overview, tasks, dead letters, workers.

Machine-owned data is read-only here: no form can write `status` or any field
the dispatcher keeps. Every action (cancel, replay, create, signal) calls the
same service function as the REST API, so it meets the same state machine and
the same validation, and each is gated by its own permission
(`tasks.cancel_task`, `tasks.replay_task`, `tasks.replay_deadletter`,
`tasks.add_task`, `signals.add_signal`): a refused POST is a 403, and CSRF is
checked by `admin_view` as everywhere in the admin. Pages read through
indexed, bounded queries (`tasks.dashboard`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.timesince import timesince
from django.views.decorators.http import require_POST

from signals.admin import SEND_PERMISSION, OptionalJSONField, SignalSendForm, signal_send_view, signal_sender
from signals.models import Signal
from tasks import dashboard, services
from tasks.errors import ValkaError
from tasks.models import ApiKey, DeadLetter, Task, TaskLog, TaskRun, Worker
from tasks.states import FINAL_STATES, TaskStatus, sources_of

admin.site.site_header = admin.site.site_title = "Valka"
admin.site.index_title = "Overview"
admin.site.enable_nav_sidebar = False  # the console's own navigation bar replaces it (templates/admin/base_site.html)

LOG_LINES_PER_RUN = 500
BULK_LIMIT = 1000
CANCELLABLE = frozenset(sources_of(TaskStatus.CANCELLED))
REPLAYABLE = frozenset({TaskStatus.DEAD_LETTER, TaskStatus.FAILED, TaskStatus.CANCELLED})


def badge(status: str) -> str:
    return format_html('<span class="vk-badge vk-{}">{}</span>', status.lower(), status)


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def span(start: Any, end: Any) -> str:
    return dashboard.age(max((end - start).total_seconds(), 0.0)) if start and end else "—"


def overview_view(request: HttpRequest) -> HttpResponse:
    """The admin index with the queue overview on top (routed in valka/urls.py ahead of the admin)."""
    context = {"overview": dashboard.overview()} if request.user.has_perm("tasks.view_task") else {}
    return admin.site.index(request, extra_context=context)


def runs_with_logs(task_id: Any) -> list[TaskRun]:
    """The task's runs in order, each with its last LOG_LINES_PER_RUN lines (index task_logs_run_idx)."""
    runs = list(TaskRun.objects.filter(task_id=task_id).order_by("attempt_number"))
    for run in runs:
        lines = list(TaskLog.objects.filter(run_id=run.id).order_by("-id")[:LOG_LINES_PER_RUN])
        run.log_lines = lines[::-1]
        run.last_log_id = lines[0].id if lines else 0
        run.logs_truncated = len(lines) == LOG_LINES_PER_RUN
        run.duration = span(run.started_at, run.finished_at or timezone.now())
    return runs


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


class ConsoleAdmin(admin.ModelAdmin):
    """Read-only pages with estimated counts, exact-match search, and confirmable actions."""

    paginator = dashboard.EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False  # tasks leave through retention (or the API's delete of a finished task)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict | None = None) -> HttpResponse:
        if request.method == "POST":
            raise PermissionDenied  # nothing here is edited through a form
        return super().change_view(request, object_id, form_url, extra_context)

    def get_viewable(self, request: HttpRequest, object_id: Any) -> Any:
        obj = self.get_object(request, str(object_id))
        if obj is None:
            raise Http404(f"{self.opts.verbose_name} {object_id} not found")
        if not self.has_view_permission(request, obj):
            raise PermissionDenied
        return obj

    def page(self, request: HttpRequest, template: str, obj: Any, **context: Any) -> TemplateResponse:
        return TemplateResponse(request, template, {
            **self.admin_site.each_context(request), "opts": self.opts, "original": obj, "title": str(obj),
            "has_view_permission": True, **context,
        })

    def confirm(self, request: HttpRequest, *, title: str, objects: list[Any], button: str, warning: str = "",
                action: str = "", selected: list[Any] | None = None, form_action: str = "",
                back: str = "") -> TemplateResponse:
        """An intermediate page that posts the same request again with `post=yes`."""
        return TemplateResponse(request, "admin/valka/confirm.html", {
            **self.admin_site.each_context(request), "opts": self.opts, "title": title, "objects": objects,
            "button": button, "warning": warning, "action": action, "selected": selected or [],
            "action_checkbox_name": ACTION_CHECKBOX_NAME, "form_action": form_action,
            "back": back or request.get_full_path(),
        })

    def bulk_ids(self, request: HttpRequest, queryset: QuerySet) -> list[Any] | None:
        ids = list(queryset.order_by().values_list("pk", flat=True)[: BULK_LIMIT + 1])
        if len(ids) > BULK_LIMIT:
            self.message_user(request, f"Select at most {BULK_LIMIT} rows for a bulk action.", messages.ERROR)
            return None
        return ids

    def get_search_results(self, request: Any, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        """A UUID finds by id; other text matches indexed columns exactly (no LIKE over millions)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(self.search_by_id(uuid.UUID(term))), False
        except ValueError:
            return queryset.filter(self.search_by_text(term)), False

    def search_by_id(self, value: uuid.UUID) -> Q:
        return Q(pk=value)

    def search_by_text(self, term: str) -> Q:
        return Q(pk__in=[])

    def report(self, request: HttpRequest, done: int, verb: str, refused: list[str]) -> None:
        if done:
            noun = self.opts.verbose_name if done == 1 else self.opts.verbose_name_plural
            self.message_user(request, f"{verb} {done} {noun}.", messages.SUCCESS)
        for message in refused[:10]:
            self.message_user(request, message, messages.WARNING)
        if len(refused) > 10:
            self.message_user(request, f"… and {len(refused) - 10} more refused.", messages.WARNING)


class TaskCreateForm(forms.Form):
    task_name = forms.CharField(max_length=255)
    queue = forms.CharField(max_length=255, initial="default")
    input = OptionalJSONField(required=False, widget=forms.Textarea(attrs={"rows": 6, "cols": 70}),
                              help_text="JSON; empty means null.")
    metadata = OptionalJSONField(required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
                                 help_text="A JSON object.")
    priority = forms.IntegerField(required=False, help_text="Higher runs first; default 0.")
    max_retries = forms.IntegerField(required=False)
    timeout_seconds = forms.IntegerField(required=False)
    idempotency_key = forms.CharField(max_length=255, required=False,
                                      help_text="A second task with the same key is not created.")
    run_at = forms.DateTimeField(required=False, help_text="UTC, e.g. 2030-01-31 12:00; empty means now.")


@admin.register(Task)
class TaskAdmin(ConsoleAdmin):
    list_display = ["task", "task_name", "queue", "status_badge", "attempts", "priority", "created_at", "finished_at"]
    list_filter = ["status", QueueFilter, TaskNameFilter, "created_at"]
    search_fields = ["task_name"]  # see search_by_text: id, exact task_name or idempotency key
    search_help_text = "Task id, exact task name, or idempotency key."
    sortable_by = ["task", "created_at"]
    ordering = ["-id"]  # UUIDv7: newest first, along the primary key
    actions = ["cancel_selected", "replay_selected"]

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
            path("<uuid:object_id>/signal/", view(require_POST(signal_send_view)), name="tasks_task_signal"),
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

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict | None = None) -> HttpResponse:
        if request.method == "POST":
            raise PermissionDenied
        task = self.get_viewable(request, object_id)
        user = request.user
        runs = runs_with_logs(task.id)
        return self.page(
            request, "admin/tasks/task/detail.html", task, badge=badge(task.status), runs=runs,
            live_run=next((r for r in runs if r.status == "RUNNING"), None),
            input_json=pretty_json(task.input), output_json=pretty_json(task.output),
            metadata_json=pretty_json(task.metadata),
            signals=list(Signal.objects.filter(task_id=task.id).order_by("id")[:200]),
            replays=list(Task.objects.filter(replayed_from_task_id=task.id).order_by("id")[:50]),
            dead_letter=DeadLetter.objects.filter(task_id=task.id).first(),
            waited=span(task.run_at, task.started_at), ran=span(task.started_at, task.finished_at or timezone.now()),
            can_cancel=task.status in CANCELLABLE and self.has_cancel_permission(request),
            can_replay=task.status in REPLAYABLE and self.has_replay_permission(request),
            can_signal=task.status not in FINAL_STATES and user.has_perm(SEND_PERMISSION),
            signal_form=SignalSendForm(), signals_available=signal_sender() is not None,
        )

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
        return self._bulk(request, queryset, "cancel_selected", "Cancel", "Cancelled",
                          lambda task_id: services.task_cancel(task_id=task_id, reason="cancelled from the admin"))

    @admin.action(description="Replay selected tasks (DEAD_LETTER, FAILED, CANCELLED)", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self._bulk(request, queryset, "replay_selected", "Replay", "Replayed",
                          lambda task_id: services.task_replay(task_id=task_id))

    def _bulk(self, request: HttpRequest, queryset: QuerySet, action: str, verb: str, done_verb: str,
              apply: Any) -> HttpResponse | None:
        ids = self.bulk_ids(request, queryset)
        if ids is None:
            return None
        if request.POST.get("post") != "yes":
            return self.confirm(request, title=f"{verb} {len(ids)} tasks?", action=action, selected=ids,
                                objects=list(Task.objects.filter(id__in=ids[:100]).order_by("-id")),
                                button=f"Yes, {verb.lower()} {len(ids)} tasks")
        done, refused = 0, []
        for task_id in ids:
            try:
                apply(task_id)
                done += 1
            except ValkaError as exc:
                refused.append(exc.message)
        self.report(request, done, done_verb, refused)
        return None

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


@admin.register(DeadLetter)
class DeadLetterAdmin(ConsoleAdmin):
    list_display = ["letter", "task_name", "queue", "error", "attempt_count", "age", "replayed"]
    list_filter = [DeadLetterQueueFilter, ReplayedFilter, "created_at"]
    search_fields = ["task_name"]  # see search_by_text
    search_help_text = "Dead letter or task id, exact task name, or words of the error."
    ordering = ["-created_at"]
    actions = ["replay_selected", "delete_selected"]

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return request.user.has_perm("tasks.delete_deadletter")

    def has_replay_permission(self, request: Any) -> bool:
        return request.user.has_perm("tasks.replay_deadletter")

    def search_by_id(self, value: uuid.UUID) -> Q:
        return Q(pk=value) | Q(task_id=value)

    def search_by_text(self, term: str) -> Q:
        return Q(task_name=term) | Q(error_message__icontains=term)

    @admin.display(description="dead letter", ordering="created_at")
    def letter(self, obj: DeadLetter) -> str:
        return str(obj.id)

    @admin.display(description="error")
    def error(self, obj: DeadLetter) -> str:
        return Truncator(obj.error_message or "").chars(90)

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: DeadLetter) -> str:
        return timesince(obj.created_at)

    @admin.display(description="replayed")
    def replayed(self, obj: DeadLetter) -> str:
        if obj.replayed_at is None:
            return "—"
        link = reverse("admin:tasks_task_change", args=[obj.replay_task_id]) if obj.replay_task_id else ""
        return format_html('<a href="{}">{}× , {} ago</a>', link, obj.replay_count, timesince(obj.replayed_at))

    def get_urls(self) -> list:
        view = self.admin_site.admin_view(require_POST(self.replay_view))
        return [path("<uuid:object_id>/replay/", view, name="tasks_deadletter_replay"), *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict | None = None) -> HttpResponse:
        if request.method == "POST":
            raise PermissionDenied
        letter = self.get_viewable(request, object_id)
        return self.page(
            request, "admin/tasks/deadletter/detail.html", letter,
            input_json=pretty_json(letter.input), metadata_json=pretty_json(letter.metadata),
            runs=runs_with_logs(letter.task_id) if letter.task_id else [],
            replays=list(Task.objects.filter(replayed_from_dead_letter_id=letter.id).order_by("id")[:50]),
            can_replay=self.has_replay_permission(request),
            can_delete=self.has_delete_permission(request, letter),
        )

    def replay_view(self, request: HttpRequest, object_id: uuid.UUID) -> HttpResponse:
        """Replay one; a dead letter that was replayed already asks for confirmation first."""
        if not self.has_replay_permission(request):
            raise PermissionDenied
        letter = self.get_viewable(request, object_id)
        if letter.replayed_at is not None and request.POST.get("post") != "yes":
            return self.confirm(
                request, title="Replay this dead letter again?", objects=[letter], button="Yes, replay it again",
                warning=f"It was replayed {letter.replay_count} time(s) already, last {timesince(letter.replayed_at)} "
                        "ago. Another replay runs the task once more.",
                form_action=request.path, back=reverse("admin:tasks_deadletter_change", args=[letter.id]))
        try:
            new = services.dead_letter_replay(dead_letter_id=letter.id)
        except ValkaError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return HttpResponseRedirect(reverse("admin:tasks_deadletter_change", args=[letter.id]))
        self.log_change(request, letter, f"Replayed as {new.id}")
        self.message_user(request, f"Replayed as a new PENDING task {new.id}.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:tasks_task_change", args=[new.id]))

    @admin.action(description="Replay selected dead letters", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        ids = self.bulk_ids(request, queryset)
        if ids is None:
            return None
        if request.POST.get("post") != "yes":
            again = DeadLetter.objects.filter(id__in=ids, replayed_at__isnull=False).count()
            warning = f"{again} of them were replayed already and will run once more." if again else ""
            return self.confirm(request, title=f"Replay {len(ids)} dead letters?", action="replay_selected",
                                selected=ids, objects=list(DeadLetter.objects.filter(id__in=ids[:100])),
                                button=f"Yes, replay {len(ids)} dead letters", warning=warning)
        done, refused = 0, []
        for letter_id in ids:
            try:
                services.dead_letter_replay(dead_letter_id=letter_id)
                done += 1
            except ValkaError as exc:
                refused.append(exc.message)
        self.report(request, done, "Replayed", refused)
        return None


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


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "created_at", "last_used_at", "revoked"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
    list_filter = ["revoked"]
    search_fields = ["name", "prefix"]

    def has_add_permission(self, request: Any) -> bool:
        return False  # keys are created with `manage.py create_api_key`, which shows the key once
