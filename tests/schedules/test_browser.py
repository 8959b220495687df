"""The schedule form in a real browser (Debian's chromium through Playwright, as in
tests/tasks/admin/test_browser.py, whose fixtures this uses): the next slots shown for what was
typed, a bad cron expression refused on its field, then saved. A screenshot goes to test-artifacts/."""

import pytest

from schedules.models import Schedule
from tests.tasks.admin.test_browser import browser, expect, needs_chromium, page, shot  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium]


def test_the_form_shows_the_next_slots_and_refuses_a_bad_cron_on_its_field(page):  # noqa: F811
    page.goto("/admin/schedules/schedule/add/")
    page.fill("#id_name", "weekday-report")
    page.fill("#id_cron", "0 9 * * 1-5")
    page.fill("#id_timezone", "Europe/Berlin")
    page.fill("#id_task_name", "report.build")
    page.fill("#id_queue", "reports")
    page.click("#vk-preview")
    slots = page.locator("#vk-upcoming tbody tr")
    expect(slots).to_have_count(5)
    expect(slots.nth(4)).to_be_visible()
    for i in range(5):
        expect(slots.nth(i)).to_contain_text("09:00 CE")  # CET or CEST: Berlin's wall clock
    expect(page.locator("#vk-upcoming h2")).to_contain_text("not saved")
    assert not Schedule.objects.exists()

    page.fill("#id_cron", "0 9 * *")
    page.click("input[name=_save]")
    expect(page.locator(".field-cron .errorlist")).to_contain_text("must have 5 fields")
    expect(page.locator("#vk-upcoming tbody tr")).to_have_count(0)
    assert not Schedule.objects.exists()

    page.fill("#id_cron", "0 9 * * 1-5")
    page.click("input[name=_continue]")
    expect(page.locator(".messagelist")).to_contain_text("weekday-report")
    expect(page.locator("#vk-upcoming tbody tr")).to_have_count(5)
    assert Schedule.objects.get().next_run_at is not None
    shot(page, "schedule.png")
