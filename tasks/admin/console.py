"""What every console page shares: the read-only base admin, its confirmable bulk actions, and
the small helpers the pages use (status badge, pretty JSON, durations, a run's log tail)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html

from tasks import dashboard
from tasks.errors import ValkaError
from tasks.models import TaskLog, TaskRun

LOG_LINES_PER_RUN = 500
BULK_LIMIT = 1000


def badge(status: str) -> str:
    """A status as the console shows it everywhere (styled by static/valka/valka.css)."""
    return format_html('<span class="vk-badge vk-{}">{}</span>', status.lower(), status)


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def span(start: Any, end: Any) -> str:
    return dashboard.age(max((end - start).total_seconds(), 0.0)) if start and end else "—"


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


class OptionalJSONField(forms.JSONField):
    """A JSON textarea that starts empty (not "null"); empty means None."""

    def prepare_value(self, value: Any) -> Any:
        return "" if value is None else super().prepare_value(value)


class ConsoleAdmin(admin.ModelAdmin):
    """Read-only pages with estimated counts, exact-match search, and confirmable actions.

    A model with a page of its own sets `detail_template` and `detail_context`; nothing is ever
    edited through a form, so a POST to a change page is refused (403) before anything is read.
    """

    paginator = dashboard.EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    detail_template = ""  # the object's own page instead of Django's change form

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
        if not self.detail_template:
            return super().change_view(request, object_id, form_url, extra_context)
        obj = self.get_viewable(request, object_id)
        return TemplateResponse(request, self.detail_template, {
            **self.admin_site.each_context(request), "opts": self.opts, "original": obj, "title": str(obj),
            "has_view_permission": True, **self.detail_context(request, obj),
        })

    def detail_context(self, request: HttpRequest, obj: Any) -> dict[str, Any]:
        """What `detail_template` shows of `obj` besides the object itself."""
        return {}

    def get_viewable(self, request: HttpRequest, object_id: Any) -> Any:
        obj = self.get_object(request, str(object_id))
        if obj is None:
            raise Http404(f"{self.opts.verbose_name} {object_id} not found")
        if not self.has_view_permission(request, obj):
            raise PermissionDenied
        return obj

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

    def bulk(self, request: HttpRequest, queryset: QuerySet, *, action: str, verb: str, done_verb: str,
             apply: Callable[[Any], Any], warning: Callable[[list[Any]], str] | None = None) -> HttpResponse | None:
        """A bulk action: a confirmation page first, then `apply(pk)` for each selected row through
        the service layer, one at a time; what the service refuses is reported, not raised."""
        ids = self.bulk_ids(request, queryset)
        if ids is None:
            return None
        noun = self.opts.verbose_name_plural
        if request.POST.get("post") != "yes":
            return self.confirm(request, title=f"{verb} {len(ids)} {noun}?", action=action, selected=ids,
                                objects=list(self.model.objects.filter(pk__in=ids[:100])),
                                button=f"Yes, {verb.lower()} {len(ids)} {noun}",
                                warning=warning(ids) if warning else "")
        done, refused = 0, []
        for pk in ids:
            try:
                apply(pk)
                done += 1
            except ValkaError as exc:
                refused.append(exc.message)
        self.report(request, done, done_verb, refused)
        return None

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
