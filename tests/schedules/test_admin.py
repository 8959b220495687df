"""Schedules in the console: the list, the form (checked on its fields, its next slots shown),
declared schedules, the actions and their permissions, the overview's panel and a task's link back."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from schedules import services
from schedules.models import Schedule
from schedules.slots import zone
from tasks.models import Task
from tests.factories import TaskFactory
from tests.schedules.helpers import make_schedule

pytestmark = pytest.mark.django_db

LIST = "/admin/schedules/schedule/"
ADD = "/admin/schedules/schedule/add/"
FORM = {"name": "nightly", "enabled": "on", "cron": "30 2 * * *", "interval_seconds": "", "timezone": "Europe/Berlin",
        "catch_up": "latest", "start_at": "", "end_at": "", "task_name": "report", "queue": "reports",
        "input": '{"kind": "daily"}', "metadata": "", "priority": "0", "max_retries": "3", "timeout_seconds": "300"}


def change(schedule: Schedule) -> str:
    return f"/admin/schedules/schedule/{schedule.pk}/change/"


def slots_shown(html: str) -> list[str]:
    return re.findall(r'<td><time datetime="([^"]+)">', html)


def test_the_list_shows_timing_next_and_last_run_with_its_tasks_badge(admin_client):
    task = TaskFactory(status="FAILED")
    make_schedule("hourly-job", next_run_at=timezone.now() + timedelta(minutes=5), cron="0 * * * *",
                  timezone="Europe/Berlin", last_run_at=timezone.now(), last_task_id=task.id)
    make_schedule("ticker", next_run_at=None, interval_seconds=30, enabled=False,
                  last_run_at=timezone.now(), last_task_id=Task().id)  # its task deleted since
    html = admin_client.get(LIST).content.decode()
    assert "hourly-job" in html and "0 * * * *" in html and "Europe/Berlin" in html and "every 30 s" in html
    assert f'href="/admin/tasks/task/{task.id}/change/"><span class="vk-badge vk-failed">FAILED</span>' in html
    assert "task deleted" in html
    assert admin_client.get(LIST + "?enabled__exact=0").content.decode().count("every 30 s") == 1
    assert "hourly-job" not in admin_client.get(LIST + "?enabled__exact=0").content.decode()


def test_the_form_creates_through_the_service_and_shows_the_next_slots(admin_client):
    response = admin_client.post(ADD, {**FORM, "_continue": "Save"})
    assert response.status_code == 302, response.content.decode()[-3000:]
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.input, schedule.declared) == ("30 2 * * *", {"kind": "daily"}, False)
    assert schedule.next_run_at is not None and schedule.next_run_at > timezone.now()
    shown = slots_shown(admin_client.get(response["Location"]).content.decode())
    assert len(shown) == 5 and shown[0] == timezone.localtime(schedule.next_run_at, zone("Europe/Berlin")).isoformat()


@pytest.mark.parametrize(("change_", "fields"), [
    ({"cron": "30 25 * * *"}, ["cron"]),
    ({"cron": "every night"}, ["cron"]),
    ({"timezone": "Europe/Gotham"}, ["timezone"]),
    ({"interval_seconds": "60"}, ["cron", "interval_seconds"]),
    ({"cron": ""}, ["cron", "interval_seconds"]),
    ({"cron": "", "interval_seconds": "0"}, ["interval_seconds"]),
    ({"start_at_0": "2030-01-02", "start_at_1": "00:00:00", "end_at_0": "2030-01-01", "end_at_1": "00:00:00"},
     ["end_at"]),
    ({"queue": "not a queue"}, ["queue"]),
    ({"metadata": '{"valka.schedule": "x"}'}, ["metadata"]),
])
def test_bad_input_shows_on_its_field_and_writes_nothing(admin_client, change_, fields):
    response = admin_client.post(ADD, {**FORM, **change_, "_save": "Save"})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert set(fields) <= set(errors), errors
    assert not Schedule.objects.exists()


def test_preview_shows_the_slots_of_what_was_typed_without_saving(admin_client):
    html = admin_client.post(ADD, {**FORM, "cron": "0 9 * 1,2,12 1-5", "_preview": "1"}).content.decode()
    shown = slots_shown(html)
    assert len(shown) == 5 and all(slot.endswith("T09:00:00+01:00") for slot in shown), shown  # Berlin in winter
    assert "(not saved)" in html and not Schedule.objects.exists()
    bad = admin_client.post(ADD, {**FORM, "cron": "0 9 * *", "_preview": "1"})
    assert "cron" in bad.context["adminform"].form.errors and not slots_shown(bad.content.decode())


def test_a_change_of_timing_moves_the_next_slot(admin_client):
    services.schedule_create(data={"name": "nightly", "cron": "30 2 * * *", "task_name": "report", "queue": "r"})
    schedule = Schedule.objects.get()
    response = admin_client.post(change(schedule), {**FORM, "name": "ignored", "cron": "*/5 * * * *", "_save": "1"})
    assert response.status_code == 302, response.content.decode()[-2000:]
    moved = Schedule.objects.get()
    assert moved.name == "nightly" and moved.cron == "*/5 * * * *" and moved.timezone == "Europe/Berlin"
    assert moved.next_run_at - timezone.now() <= timedelta(minutes=5)


def test_a_declared_schedule_is_read_only_but_for_enabled(admin_client):
    services.schedules_reconcile(entries=[{"name": "declared", "cron": "@daily", "task_name": "t", "queue": "q"}])
    schedule = Schedule.objects.get()
    page = admin_client.get(change(schedule))
    assert list(page.context["adminform"].form.fields) == ["enabled"]
    assert not page.context["has_delete_permission"]
    response = admin_client.post(change(schedule), {"cron": "@hourly", "_save": "1"})  # enabled unticked
    assert response.status_code == 302
    kept = Schedule.objects.get()
    assert kept.cron == "@daily" and not kept.enabled
    assert admin_client.post(f"/admin/schedules/schedule/{schedule.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Schedule.objects.exists()


def action(client, name: str, *schedules: Schedule):
    return client.post(LIST, {"action": name, "_selected_action": [s.pk for s in schedules]}, follow=True)


def test_enable_disable_and_trigger_need_their_permissions(staff_client):
    a = make_schedule("a", next_run_at=timezone.now() + timedelta(hours=1))
    b = make_schedule("b", next_run_at=timezone.now() + timedelta(hours=1))
    viewer = staff_client("schedules.view_schedule")
    assert "disable_selected" not in viewer.get(LIST).content.decode()
    action(viewer, "disable_selected", a, b)
    action(viewer, "trigger_selected", a)
    assert Schedule.objects.filter(enabled=True).count() == 2 and not Task.objects.exists()

    changer = staff_client("schedules.view_schedule", "schedules.change_schedule")
    assert "Disabled 2 schedule(s)." in action(changer, "disable_selected", a, b).content.decode()
    assert not Schedule.objects.filter(enabled=True).exists()
    assert "Enabled 1 schedule(s)." in action(changer, "enable_selected", a).content.decode()
    assert Schedule.objects.get(enabled=True) == a
    action(changer, "trigger_selected", a)
    assert not Task.objects.exists()

    trigger = staff_client("schedules.view_schedule", "schedules.trigger_schedule")
    assert "Triggered" in action(trigger, "trigger_selected", a, b).content.decode()
    assert sorted(t.metadata["valka.schedule"] for t in Task.objects.all()) == ["a", "b"]
    assert Schedule.objects.get(name="a").last_task_id is not None


def test_the_overview_shows_the_next_schedules_due(staff_client):
    soon = make_schedule("soon", next_run_at=timezone.now() + timedelta(minutes=1))
    make_schedule("later", next_run_at=timezone.now() + timedelta(hours=1))
    make_schedule("off", next_run_at=timezone.now(), enabled=False)
    html = staff_client("schedules.view_schedule").get("/admin/").content.decode()
    panel = html[html.index('id="vk-next-schedules"'):]
    assert panel.index("soon") < panel.index("later") and "off" not in panel[:panel.index("</section>")]
    assert f"/admin/schedules/schedule/{soon.pk}/change/" in panel
    assert "vk-next-schedules" not in staff_client("tasks.view_task").get("/admin/").content.decode()


def test_a_task_made_by_a_schedule_links_back_to_it(admin_client):
    schedule = make_schedule("nightly", next_run_at=None)
    task = services.schedule_trigger(name="nightly")
    html = admin_client.get(f"/admin/tasks/task/{task.id}/change/").content.decode()
    assert f'<a href="/admin/schedules/schedule/{schedule.pk}/change/" id="vk-schedule">nightly</a>' in html
    services.schedule_delete(name="nightly")
    assert "nightly <span class='vk-zero'>(deleted)</span>" in admin_client.get(
        f"/admin/tasks/task/{task.id}/change/").content.decode()
    plain = TaskFactory()
    assert 'id="vk-schedule"' not in admin_client.get(f"/admin/tasks/task/{plain.id}/change/").content.decode()
