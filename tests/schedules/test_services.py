"""The schedules' service layer: create, change, delete, trigger, enable, and the reconciliation of
VALKA_SCHEDULES that run_scheduler does at start."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from schedules import services
from schedules.models import Schedule
from schedules.slots import zone
from tasks.errors import InvalidState, ValidationError
from tasks.models import Task
from tests.schedules.helpers import make_schedule

pytestmark = pytest.mark.django_db

NIGHTLY = {"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin", "task_name": "report",
           "queue": "reports", "input": {"kind": "daily"}}


def test_create_computes_the_first_slot():
    before = timezone.now()
    schedule = services.schedule_create(data=NIGHTLY)
    assert schedule.next_run_at > before and schedule.next_run_at - before <= timedelta(days=1)
    assert timezone.localtime(schedule.next_run_at, zone("Europe/Berlin")).hour == 3
    assert (schedule.catch_up, schedule.enabled, schedule.declared, schedule.max_retries) == ("latest", True, False, 3)


def test_a_name_taken_is_refused_naming_name():
    services.schedule_create(data=NIGHTLY)
    with pytest.raises(ValidationError) as err:
        services.schedule_create(data={**NIGHTLY, "cron": "@hourly"})
    assert "name" in err.value.details
    assert Schedule.objects.get().cron == "0 3 * * *"


def test_a_new_timing_moves_the_next_slot_and_other_changes_keep_it():
    schedule = make_schedule("s", next_run_at=timezone.now() - timedelta(hours=1), cron="0 * * * *")
    services.schedule_update(name="s", data={"input": {"x": 1}, "enabled": False})
    kept = Schedule.objects.get(name="s")
    assert kept.next_run_at == schedule.next_run_at and kept.input == {"x": 1} and not kept.enabled
    services.schedule_update(name="s", data={"cron": None, "interval_seconds": 30})
    moved = Schedule.objects.get(name="s")
    assert moved.cron is None and timedelta(seconds=29) < moved.next_run_at - timezone.now() <= timedelta(seconds=30)
    with pytest.raises(ValidationError) as err:
        services.schedule_update(name="s", data={"cron": "* * * * *"})  # and the interval it has
    assert {"cron", "interval_seconds"} <= set(err.value.details)
    with pytest.raises(ValidationError) as err:
        services.schedule_update(name="s", data={"name": "renamed"})
    assert "name" in err.value.details
    assert Schedule.objects.get(name="s").interval_seconds == 30


def test_trigger_makes_a_task_now_and_leaves_the_slots():
    schedule = make_schedule("s", next_run_at=timezone.now() + timedelta(hours=1), input={"n": 1},
                             metadata={"team": "ops"})
    task = services.schedule_trigger(name="s")
    assert task.idempotency_key.startswith("schedule:s:manual:") and task.status == "PENDING"
    assert task.input == {"n": 1} and task.metadata == {"team": "ops", "valka.schedule": "s"}
    again = services.schedule_trigger(name="s")
    assert again.id != task.id
    after = Schedule.objects.get(name="s")
    assert after.last_task_id == again.id and after.next_run_at == schedule.next_run_at and after.fired_count == 0


def test_enable_and_disable_say_what_changed():
    a = make_schedule("a", next_run_at=None)
    b = make_schedule("b", next_run_at=None, enabled=False)
    assert services.schedules_set_enabled(ids=[a.id, b.id], enabled=True) == ["b"]
    assert sorted(services.schedules_set_enabled(ids=[a.id, b.id], enabled=False)) == ["a", "b"]


def test_delete_keeps_the_tasks():
    services.schedule_create(data=NIGHTLY)
    task = services.schedule_trigger(name="nightly")
    services.schedule_delete(name="nightly")
    assert not Schedule.objects.exists() and Task.objects.filter(id=task.id).exists()


# -- VALKA_SCHEDULES --

def test_reconcile_creates_updates_and_deletes_declared_schedules_only():
    mine = services.schedule_create(data={**NIGHTLY, "name": "made-in-the-admin"})
    assert services.schedules_reconcile(entries=[NIGHTLY, {**NIGHTLY, "name": "old"}])["created"] == ["nightly", "old"]
    first = Schedule.objects.get(name="nightly")
    assert first.declared
    services.schedules_set_enabled(ids=[first.id], enabled=False)  # an operator pauses it

    done = services.schedules_reconcile(entries=[{**NIGHTLY, "input": {"kind": "weekly"}}])
    assert done == {"created": [], "updated": ["nightly"], "deleted": ["old"]}
    updated = Schedule.objects.get(name="nightly")
    assert updated.input == {"kind": "weekly"} and not updated.enabled, "the admin's pause stands"
    assert updated.next_run_at == first.next_run_at, "the timing did not change"
    assert services.schedules_reconcile(entries=[{**NIGHTLY, "input": {"kind": "weekly"}}]) == {
        "created": [], "updated": [], "deleted": []}
    untouched = Schedule.objects.get(name="made-in-the-admin")
    assert (untouched.declared, untouched.updated_at, untouched.input) == (False, mine.updated_at, mine.input)
    services.schedules_reconcile(entries=[])
    assert list(Schedule.objects.values_list("name", flat=True)) == ["made-in-the-admin"]


def test_reconcile_refuses_a_name_made_in_the_admin():
    services.schedule_create(data=NIGHTLY)
    with pytest.raises(ValidationError) as err:
        services.schedules_reconcile(entries=[NIGHTLY])
    assert "VALKA_SCHEDULES[0] (nightly)" in err.value.message and "admin" in err.value.message
    assert not Schedule.objects.get().declared


@pytest.mark.parametrize(("entry", "field"), [
    ({**NIGHTLY, "cron": "0 25 * * *"}, "cron"),
    ({**NIGHTLY, "timezone": "Europe/Atlantis"}, "timezone"),
    ({**NIGHTLY, "interval_seconds": 60}, "interval_seconds"),
    ({**NIGHTLY, "queue": "no spaces"}, "queue"),
    ({**NIGHTLY, "catchup": "all"}, "catchup"),
])
def test_an_invalid_entry_names_the_schedule_and_the_field_and_writes_nothing(entry, field):
    with pytest.raises(ValidationError) as err:
        services.schedules_reconcile(entries=[{**NIGHTLY, "name": "fine"}, entry])
    assert err.value.message.startswith("VALKA_SCHEDULES[1] (nightly): ") and field in err.value.message
    assert field in err.value.details
    assert not Schedule.objects.exists()


def test_an_entry_that_is_no_dict_says_so():
    with pytest.raises(ValidationError) as err:
        services.schedules_reconcile(entries=[NIGHTLY, "nightly"])
    assert err.value.message == "VALKA_SCHEDULES[1]: must be a dict of a schedule's fields, not str"
    assert not Schedule.objects.exists()


def test_run_scheduler_stops_at_start_on_an_invalid_entry(settings):
    settings.VALKA = {**settings.VALKA, "SCHEDULES": [{**NIGHTLY, "cron": "0 3 * *"}], "DEVELOPMENT": True}
    with pytest.raises(CommandError, match=r"VALKA_SCHEDULES\[0\] \(nightly\): cron: must have 5 fields"):
        call_command("run_scheduler")
    assert not Schedule.objects.exists()


def test_declared_schedules_take_only_enabled_elsewhere():
    services.schedules_reconcile(entries=[NIGHTLY])
    services.schedule_update(name="nightly", data={"enabled": False, "cron": "0 3 * * *"})  # same cron: no change
    assert not Schedule.objects.get().enabled
    with pytest.raises(InvalidState) as err:
        services.schedule_update(name="nightly", data={"cron": "0 4 * * *"})
    assert "VALKA_SCHEDULES" in err.value.message and "cron" in err.value.message
    with pytest.raises(InvalidState):
        services.schedule_delete(name="nightly")
    assert Schedule.objects.get().cron == "0 3 * * *"
