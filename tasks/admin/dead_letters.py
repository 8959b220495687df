"""The dead letter queue in the console: the list, a letter's page, replay (one or in bulk)
and delete, each behind its own permission (`tasks.replay_deadletter`, `tasks.delete_deadletter`)."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.timesince import timesince
from django.views.decorators.http import require_POST

from tasks import services
from tasks.admin.console import ConsoleAdmin, pretty_json, runs_with_logs
from tasks.admin.filters import DeadLetterQueueFilter, ReplayedFilter
from tasks.errors import ValkaError
from tasks.models import DeadLetter, Task


@admin.register(DeadLetter)
class DeadLetterAdmin(ConsoleAdmin):
    list_display = ["letter", "task_name", "queue", "error", "attempt_count", "age", "replayed"]
    list_filter = [DeadLetterQueueFilter, ReplayedFilter, "created_at"]
    search_fields = ["task_name"]  # see search_by_text
    search_help_text = "Dead letter or task id, exact task name, or words of the error."
    ordering = ["-created_at"]
    actions = ["replay_selected", "delete_selected"]
    detail_template = "admin/tasks/deadletter/detail.html"

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

    def detail_context(self, request: HttpRequest, letter: DeadLetter) -> dict[str, Any]:
        return {
            "input_json": pretty_json(letter.input), "metadata_json": pretty_json(letter.metadata),
            "runs": runs_with_logs(letter.task_id) if letter.task_id else [],
            "replays": list(Task.objects.filter(replayed_from_dead_letter_id=letter.id).order_by("id")[:50]),
            "can_replay": self.has_replay_permission(request),
            "can_delete": self.has_delete_permission(request, letter),
        }

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
        def warning(ids: list[Any]) -> str:
            again = DeadLetter.objects.filter(id__in=ids, replayed_at__isnull=False).count()
            return f"{again} of them were replayed already and will run once more." if again else ""

        return self.bulk(request, queryset, action="replay_selected", verb="Replay", done_verb="Replayed",
                         apply=lambda letter_id: services.dead_letter_replay(dead_letter_id=letter_id),
                         warning=warning)
