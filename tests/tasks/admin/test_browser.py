"""The console in a real browser: Debian's chromium driven by Playwright, against a live server.

Playwright never downloads a browser here: it launches /usr/bin/chromium (installed
by scripts/ensure-chromium from `make test`); without it these tests skip.
Screenshots of the overview, a task page and a dead-letter page go to test-artifacts/.
"""

import os
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.urls import NoReverseMatch, reverse

from tasks.models import DeadLetter, Queue, Task
from tests.factories import DeadLetterFactory, TaskFactory, TaskLogFactory, TaskRunFactory

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(settings.BASE_DIR) / "test-artifacts"
PASSWORD = "operator-pw-123"

needs_chromium = pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                                    reason="needs Debian's chromium (scripts/ensure-chromium)")
pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium]

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


@pytest.fixture(scope="module")
def browser():
    # Playwright's sync API keeps an event loop in this thread; the test's own ORM calls are plain
    # synchronous code all the same, so Django's guard against ORM calls inside a loop is lifted here.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser, live_server, django_user_model, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins, tests only
    django_user_model.objects.create_superuser("operator", password=PASSWORD)
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(10_000)
    tab = context.new_page()
    tab.goto("/admin/")
    tab.fill("#id_username", "operator")
    tab.fill("#id_password", PASSWORD)
    tab.click("input[type=submit]")
    expect(tab.locator("#vk-overview")).to_be_visible()
    yield tab
    context.close()


def shot(tab, name):
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / name), full_page=True)


def test_overview_then_replay_a_dead_letter(page):
    with connection.cursor() as cursor:  # counters earlier tests committed would add bars of their own
        cursor.execute("DELETE FROM task_counters")
        cursor.execute("DELETE FROM task_counter_deltas")
    TaskFactory.create_batch(3, queue="emails")
    TaskFactory(queue="emails", status="FAILED")
    letter = DeadLetterFactory(task__queue="billing", task__task_name="invoice.charge",
                               input={"invoice": 42}, error_message="card declined")
    run = TaskRunFactory(task=letter.task, attempt_number=4, status="FAILED", error_message="card declined")
    TaskLogFactory(run=run, level="WARN", message="gateway slow")
    TaskLogFactory(run=run, level="ERROR", message="charge refused")
    for status in ("COMPLETED", "COMPLETED", "COMPLETED", "FAILED"):  # real transitions feed the chart
        done = TaskFactory(queue="reports", status="RUNNING")
        Task.objects.filter(id=done.id).update(status=status, finished_at=done.created_at)

    page.reload()
    grid = page.locator("#vk-queue-grid")
    expect(grid.locator('tr[data-queue="emails"] td[data-status="PENDING"]')).to_have_text("3")
    expect(grid.locator('tr[data-queue="billing"] td[data-status="DEAD_LETTER"]')).to_have_text("1")
    # One bar for the minute of those completions (two when the test straddles a minute boundary).
    bars = page.locator(".vk-chart rect.completed")
    expect(bars.first).to_be_visible()
    assert bars.count() in (1, 2)
    shot(page, "overview.png")

    page.click(".vk-nav >> text=Dead letters")
    page.click(f'a[href$="/deadletter/{letter.id}/change/"]')
    expect(page.locator("#vk-last-error")).to_have_text("card declined")
    expect(page.locator(".vk-log-ERROR")).to_contain_text("charge refused")
    shot(page, "dead-letter.png")

    page.click("#vk-replay")
    new = Task.objects.get(replayed_from_dead_letter=letter)
    expect(page).to_have_url(re.compile(rf"/admin/tasks/task/{new.id}/change/$"))
    expect(page.locator("#vk-status")).to_have_text("PENDING")
    expect(page.locator("#vk-replayed-from")).to_contain_text(str(letter.task_id))
    assert DeadLetter.objects.get(id=letter.id).replay_task_id == new.id
    shot(page, "task-replayed.png")


def test_pause_and_resume_a_queue_from_the_queues_page(page):
    TaskFactory.create_batch(2, queue="mail")
    TaskFactory(queue="reports", status="RUNNING")
    Queue.objects.filter(name="reports").update(max_running=4, rate_limit=30, rate_period_seconds=60)
    page.click(".vk-nav >> text=Queues")
    row = page.locator('#vk-queues tr[data-queue="mail"]')
    row.locator("input.vk-pause").click()
    expect(page.locator('#vk-queues tr[data-queue="mail"] .vk-paused')).to_have_text("PAUSED")
    expect(page.locator('#vk-queues tr[data-queue="reports"] .vk-running-now')).to_have_text("1 / 4")
    assert Queue.objects.get(name="mail").paused
    shot(page, "queues.png")
    page.locator('#vk-queues tr[data-queue="mail"] input.vk-resume').click()
    expect(page.locator('#vk-queues tr[data-queue="mail"] .vk-paused')).to_have_count(0)
    assert not Queue.objects.get(name="mail").paused


def test_live_tail_follows_a_running_run(page):
    run = TaskRunFactory(task__task_name="report.build", task__input={"month": "2026-11"},
                         task__metadata={"requested_by": "ops"}, worker_id="worker-eu-1")
    TaskLogFactory(run=run, level="DEBUG", message="loading rows")
    TaskLogFactory(run=run, message="starting")
    TaskLogFactory(run=run, level="WARN", message="slow query: 2.3 s")
    page.goto(f"/admin/tasks/task/{run.task_id}/change/")
    logs = page.locator(f"#logs-{run.id}")
    expect(page.locator(f'[data-tail-status="{run.id}"]')).to_have_text("live")
    TaskLogFactory(run=run, level="ERROR", message="disk almost full",
                   metadata={"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "00f067aa0ba902b7"})
    expect(logs.locator(".vk-log-ERROR")).to_have_text(re.compile("disk almost full"))
    expect(logs.locator(".vk-log-ERROR .vk-log-span")).to_have_text("span 00f067aa0ba902b7")
    shot(page, "task.png")
    Task.objects.filter(id=run.task_id).update(status="COMPLETED", finished_at=run.started_at)
    expect(page.locator(f'[data-tail-status="{run.id}"]')).to_contain_text("task is COMPLETED")


def test_send_a_signal_from_the_task_page(page):
    from signals import services

    if not hasattr(services, "signal_send"):
        pytest.skip("signals.services.signal_send is not built yet")
    task = TaskFactory(status="PENDING")
    page.goto(f"/admin/tasks/task/{task.id}/change/")
    page.fill("#id_signal_type", "pause")
    page.fill("#id_payload", '{"seconds": 5}')
    page.click("#vk-signal-form input[type=submit]")
    expect(page.locator("#vk-signals")).to_contain_text("pause")
    expect(page.locator(".messagelist")).to_contain_text("Signal 'pause' sent")
    assert task.signals.get().payload == {"seconds": 5}


@pytest.fixture
def events_url() -> str:
    for name in ("admin:valka_events", "admin:events", "valka-events"):
        try:
            return reverse(name)
        except NoReverseMatch:
            continue
    pytest.skip("the admin's Events page is not built yet")


@pytest.fixture
def asgi_page(browser, transactional_db, tmp_path, django_user_model):
    """A logged-in tab on the real ASGI app (uvicorn): the Events page streams Server-Sent Events,
    which the test server's WSGI cannot serve."""
    from tests.helpers import Stack

    stack = Stack(tmp_path)
    url = stack.web(VALKA_API_ANONYMOUS="false", SESSION_COOKIE_SECURE="false", CSRF_COOKIE_SECURE="false")
    django_user_model.objects.create_superuser("operator", password=PASSWORD)
    context = browser.new_context(base_url=url, viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(15_000)
    tab = context.new_page()
    tab.goto("/admin/login/")
    tab.fill("#id_username", "operator")
    tab.fill("#id_password", PASSWORD)
    tab.click("input[type=submit]")
    expect(tab.locator(".vk-nav")).to_be_visible()
    yield tab
    context.close()
    stack.stop_all()


def test_watch_a_live_event_arrive(events_url, asgi_page):
    page = asgi_page
    page.goto(events_url)
    expect(page.locator("#vk-events-state")).to_have_text("live")
    task = TaskFactory(queue="live-q")
    Task.objects.filter(id=task.id).update(status="CANCELLED", finished_at=task.created_at)
    row = page.locator("#vk-events tbody tr").filter(has_text=str(task.id)).filter(has_text="CANCELLED")
    expect(row).to_have_count(1)
    expect(page.locator("#vk-events tbody")).to_contain_text("live-q")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "events.png"), full_page=True)
