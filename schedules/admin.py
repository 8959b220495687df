"""Schedules in the console: the list, the form (its fields checked as the API checks them, and
the next five slots shown), enable, disable and trigger now; a panel of the overview; and, on
a task's page, the schedule that created it.

Every write goes through `schedules.services`, as the API's do, and each action needs its
permission: enable and disable `schedules.change_schedule`, trigger `schedules.trigger_schedule`.
A schedule declared in VALKA_SCHEDULES shows read-only but for `enabled`, and cannot be deleted.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import ActionLocation
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from schedules import selectors, services
from schedules.models import Schedule
from schedules.permissions import TRIGGER_SCHEDULES
from schedules.specs import FIELDS, SCHEDULE_KEY, parse_schedule_spec, schedule_fields
from tasks.admin.console import OptionalJSONField, badge
from tasks.errors import ValkaError
from tasks.models import Task

EVERYWHERE = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]
NEXT_DUE_SHOWN = 10
TRIGGER_LIMIT = 100  # schedules one "trigger now" fires, each a task


class ScheduleForm(forms.ModelForm):
    """Checked by `schedules.specs.parse_schedule_spec`, as the API is: each problem shows on its
    field. A valid form knows its next slots (`upcoming`)."""

    input = OptionalJSONField(required=False, widget=forms.Textarea(attrs={"rows": 4, "cols": 70}),
                              help_text="The task's input (JSON); empty means null.")
    metadata = OptionalJSONField(required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 70}),
                                 help_text=f"A JSON object; {SCHEDULE_KEY} is set on each task.")

    class Meta:
        model = Schedule
        fields = list(FIELDS)
        help_texts = {
            "cron": "5 fields (minute hour day-of-month month day-of-week) or @hourly, @daily, @weekly, "
                    "@monthly, @yearly. Leave empty for an interval.",
            "interval_seconds": "Seconds between slots, instead of cron.",
            "timezone": "IANA name, e.g. Europe/Berlin: cron slots follow its wall-clock time.",
            "catch_up": "After downtime: latest fires the most recent missed slot once, none skips them, "
                        "all fires each (at most 100).",
            "start_at": "UTC; no slot before it.", "end_at": "UTC; no slot after it.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.upcoming: list[Any] = []

    def changes(self) -> dict[str, Any]:
        """The form's fields as the service takes them."""
        data = {name: self.cleaned_data.get(name) for name in self.fields}
        if "cron" in data and not data["cron"]:
            data["cron"] = None
        if "metadata" in data and data["metadata"] is None:
            data["metadata"] = {}
        return data

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        current = schedule_fields(self.instance) if self.instance.pk else {}
        try:
            spec = parse_schedule_spec({**current, **self.changes()})
        except ValkaError as exc:
            for field, problems in exc.details.items():
                self.add_error(field if field in self.fields else None, problems)
            if not exc.details:
                self.add_error(None, exc.message)
            return cleaned
        next_run_at = self.instance.next_run_at if self.instance.pk and not self.has_changed() else None
        self.upcoming = spec.timing.upcoming(now=timezone.now(), next_run_at=next_run_at, count=selectors.UPCOMING)
        return cleaned

    def _post_clean(self) -> None:
        # The model's own checks (its constraints) say again, less well, what clean() said on the fields.
        if not self.errors:
            super()._post_clean()


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = ["name", "timing", "timezone", "next_run_at", "last_run", "enabled"]
    list_filter = ["enabled", "declared", "catch_up", "queue"]
    list_select_related = ["last_task"]
    search_fields = ["=name", "=task_name"]
    search_help_text = "Exact schedule name or task name."
    actions = ["enable_selected", "disable_selected", "trigger_selected"]
    change_form_template = "admin/schedules/schedule/change_form.html"
    fieldsets = [
        (None, {"fields": ["name", "enabled", ("cron", "interval_seconds"), "timezone", "catch_up",
                           ("start_at", "end_at")]}),
        ("The task it creates", {"fields": ["task_name", "queue", "input", "metadata",
                                            ("priority", "max_retries", "timeout_seconds")]}),
    ]

    @admin.display(description="schedule")
    def timing(self, obj: Schedule) -> str:
        return obj.every

    @admin.display(description="last run", ordering="last_run_at")
    def last_run(self, obj: Schedule) -> str:
        if obj.last_run_at is None:
            return "—"
        when = timezone.localtime(obj.last_run_at).strftime("%Y-%m-%d %H:%M:%S")
        if obj.last_task_id is None:
            return when
        task = obj.last_task  # loaded with the list (list_select_related); None once retention deleted it
        if task is None:
            return format_html("{} <span class='vk-zero'>task deleted</span>", when)
        return format_html('{} <a href="{}">{}</a>', when, reverse("admin:tasks_task_change", args=[task.id]),
                           badge(task.status))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        return super().get_queryset(request).select_related("last_task")

    def get_readonly_fields(self, request: HttpRequest, obj: Schedule | None = None) -> list[str]:
        if obj is None:
            return []
        if obj.declared:
            return [name for name in FIELDS if name != "enabled"]  # VALKA_SCHEDULES owns the rest
        return ["name"]

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return super().has_delete_permission(request, obj) and not (obj is not None and obj.declared)

    def has_trigger_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(TRIGGER_SCHEDULES.permission)

    def save_model(self, request: HttpRequest, obj: Schedule, form: ScheduleForm, change: bool) -> None:
        """Through the service layer, as the API writes: `obj` becomes the row as saved."""
        if change:
            saved = services.schedule_update(name=form.instance.name, data=form.changes())
        else:
            saved = services.schedule_create(data=form.changes())
        for field in Schedule._meta.concrete_fields:
            setattr(obj, field.attname, getattr(saved, field.attname))
        obj._state.adding = False

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        services.schedule_delete(name=obj.name)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for name in queryset.filter(declared=False).values_list("name", flat=True):
            services.schedule_delete(name=name)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict | None = None) -> HttpResponse:
        if request.method == "POST" and "_preview" in request.POST:
            return self.preview(request, object_id, form_url)
        schedule = self.get_object(request, object_id)
        context = {"upcoming": selectors.schedule_upcoming(schedule) if schedule else [],
                   "upcoming_zone": schedule.timezone if schedule else "UTC", **(extra_context or {})}
        return super().change_view(request, object_id, form_url, context)

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: dict | None = None) -> HttpResponse:
        if request.method == "POST" and "_preview" in request.POST:
            return self.preview(request, None, form_url)
        return super().add_view(request, form_url, extra_context)

    def preview(self, request: HttpRequest, object_id: str | None, form_url: str) -> HttpResponse:
        """The form as posted, checked and shown again with its next slots, not saved."""
        obj = self.get_object(request, object_id) if object_id else None
        if object_id and obj is None:
            raise Http404(f"schedule {object_id} not found")
        if not (self.has_change_permission(request, obj) if obj else self.has_add_permission(request)):
            raise PermissionDenied
        fieldsets = self.get_fieldsets(request, obj)
        form = self.get_form(request, obj, change=obj is not None)(request.POST, instance=obj)
        valid = form.is_valid()
        admin_form = helpers.AdminForm(form, list(fieldsets), {}, self.get_readonly_fields(request, obj),
                                       model_admin=self)
        context = {
            **self.admin_site.each_context(request), "title": "Change schedule" if obj else "Add schedule",
            "adminform": admin_form, "object_id": object_id, "original": obj, "is_popup": False, "to_field": None,
            "media": self.media + admin_form.media, "inline_admin_formsets": [],
            "errors": helpers.AdminErrorList(form, []), "preserved_filters": self.get_preserved_filters(request),
            "upcoming": form.upcoming,
            "upcoming_zone": (form.cleaned_data.get("timezone") if valid else None) or (obj.timezone if obj else "UTC"),
            "previewed": valid,
        }
        return self.render_change_form(request, context, add=obj is None, change=obj is not None, obj=obj,
                                       form_url=form_url)

    @admin.action(description="Enable selected schedules", permissions=["change"], location=EVERYWHERE)
    def enable_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        changed = services.schedules_set_enabled(ids=list(queryset.values_list("id", flat=True)), enabled=True)
        self.message_user(request, f"Enabled {len(changed)} schedule(s).", messages.SUCCESS)

    @admin.action(description="Disable selected schedules", permissions=["change"], location=EVERYWHERE)
    def disable_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        changed = services.schedules_set_enabled(ids=list(queryset.values_list("id", flat=True)), enabled=False)
        self.message_user(request, f"Disabled {len(changed)} schedule(s).", messages.SUCCESS)

    @admin.action(description="Trigger selected schedules now", permissions=["trigger"], location=EVERYWHERE)
    def trigger_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        names = list(queryset.values_list("name", flat=True)[:TRIGGER_LIMIT + 1])
        if len(names) > TRIGGER_LIMIT:
            self.message_user(request, f"Trigger at most {TRIGGER_LIMIT} schedules at once.", messages.ERROR)
            return
        made = [services.schedule_trigger(name=name) for name in names]
        links = format_html_join(", ", '<a href="{}">{}</a>',
                                 ((reverse("admin:tasks_task_change", args=[t.id]), t.id) for t in made))
        self.message_user(request, format_html("Triggered: {}", links), messages.SUCCESS)


def next_due_panel(request: HttpRequest) -> dict[str, Any] | None:
    """The overview's panel (tasks.admin.overview.PANELS): the schedules due next."""
    if not request.user.has_perm("schedules.view_schedule"):
        return None
    rows = selectors.schedules_next_due(limit=NEXT_DUE_SHOWN)
    for row in rows:
        row["every"] = row["cron"] if row["cron"] is not None else f"every {row['interval_seconds']} s"
        row["badge"] = badge(row["last_task_status"]) if row["last_task_status"] else ""
    return {"template": "admin/schedules/overview_panel.html", "schedules": rows}


def schedule_of_task(task: Task) -> list[tuple[str, str]]:
    """A task's page (tasks.admin.tasks.DETAIL_FACTS): the schedule that created it, from its metadata."""
    name = task.metadata.get(SCHEDULE_KEY) if isinstance(task.metadata, dict) else None
    if not isinstance(name, str):
        return []
    schedule_id = Schedule.objects.filter(name=name).values_list("id", flat=True).first()
    if schedule_id is None:
        return [("schedule", format_html("{} <span class='vk-zero'>(deleted)</span>", name))]
    return [("schedule", format_html('<a href="{}" id="vk-schedule">{}</a>',
                                     reverse("admin:schedules_schedule_change", args=[schedule_id]), name))]
