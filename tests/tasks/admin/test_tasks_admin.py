"""The task pages: list, detail, actions, permissions, CSRF, and the create form."""

import html as htmllib
import re
import uuid
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tasks.models import Task
from tests.factories import SignalFactory, TaskFactory, TaskLogFactory, TaskRunFactory

pytestmark = pytest.mark.django_db

LIST = "/admin/tasks/task/"


def page(task_id):
    return f"/admin/tasks/task/{task_id}/change/"


def test_admin_is_unreachable_without_a_staff_login(client, django_user_model):
    task = TaskFactory(status="FAILED")
    urls = ["/admin/", LIST, page(task.id), "/admin/tasks/task/add/", "/admin/tasks/deadletter/",
            "/admin/tasks/worker/"]
    for url in urls:
        r = client.get(url)
        assert r.status_code == 302 and r["Location"].startswith("/admin/login/"), url
    user = django_user_model.objects.create_user("plain", password="pw-123456")  # logged in, not staff
    client.force_login(user)
    for url in urls:
        assert client.get(url)["Location"].startswith("/admin/login/"), url
    for action in ("cancel", "replay"):
        assert client.post(f"/admin/tasks/task/{task.id}/{action}/").status_code == 302
    assert Task.objects.count() == 1


def test_list_shows_badges_newest_first_without_counting_the_table(admin_client):
    older = TaskFactory(task_name="mail.send")
    newer = TaskFactory(task_name="report.build", status="FAILED")
    with CaptureQueriesContext(connection) as queries:
        r = admin_client.get(LIST)
    html = r.content.decode()
    assert r.status_code == 200
    assert html.index(str(newer.id)) < html.index(str(older.id))
    assert '<span class="vk-badge vk-failed">FAILED</span>' in html
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and '"tasks"' in q["sql"]]
    assert counts and all("LIMIT" in sql for sql in counts), counts  # bounded counts only
    assert not any("SELECT DISTINCT" in q["sql"] for q in queries)  # filters use loose index scans
    assert "?queue=default" in html and "?task_name=mail.send" in html


def test_filters_and_search(admin_client):
    a = TaskFactory(queue="a", task_name="x.one", idempotency_key="order-17")
    b = TaskFactory(queue="b", task_name="x.two", status="COMPLETED")
    old = TaskFactory(queue="a", task_name="x.one", created_at=timezone.now() - timedelta(days=30))

    def shown(query):
        return set(re.findall(r"/admin/tasks/task/([0-9a-f-]{36})/change/", admin_client.get(LIST + query)
                              .content.decode()))

    assert shown("?queue=a") == {str(a.id), str(old.id)}
    assert shown("?status__exact=COMPLETED") == {str(b.id)}
    assert shown("?task_name=x.one") == {str(a.id), str(old.id)}
    since = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=7)
    assert shown("?" + urlencode({"created_at__gte": str(since)})) == {str(a.id), str(b.id)}
    assert shown(f"?q={b.id}") == {str(b.id)}
    assert shown("?q=x.two") == {str(b.id)}
    assert shown("?q=order-17") == {str(a.id)}
    assert shown("?q=nothing-like-it") == set()


def test_task_page_shows_everything_read_only(admin_client):
    parent = TaskFactory(status="FAILED")
    task = TaskFactory(status="RUNNING", attempt_count=2, input={"user": 7, "tags": ["a"]}, metadata={"tenant": "t1"},
                       replayed_from_task=parent)
    first = TaskRunFactory(task=task, attempt_number=1, status="FAILED", error_message="Timeout talking to SMTP")
    live = TaskRunFactory(task=task, attempt_number=2)
    TaskLogFactory(run=first, level="ERROR", message="smtp down")
    TaskLogFactory(run=live, level="WARN", message="slow")
    last = TaskLogFactory(run=live, level="DEBUG", message="tick")
    SignalFactory(task=task, signal_type="pause")
    r = admin_client.get(page(task.id))
    html = r.content.decode()
    assert r.status_code == 200
    text = htmllib.unescape(html)
    assert '{\n  "tags": [\n    "a"\n  ],\n  "user": 7\n}' in text and '"tenant": "t1"' in text  # pretty JSON
    assert "Timeout talking to SMTP" in html and "vk-log-ERROR" in html and "vk-log-WARN" in html
    assert "vk-log-DEBUG" in html and "pause" in html
    assert f'href="/admin/tasks/task/{parent.id}/change/"' in html
    # the live tail targets the running run, from the last line shown
    assert f'data-logs-url="/api/v1/tasks/{task.id}/runs/{live.id}/logs"' in html
    assert f'data-after="{last.id}"' in html and "valka/live-tail.js" in html
    assert 'id="vk-cancel"' in html and 'id="vk-replay"' not in html
    # nothing is editable: a form post is refused and changes nothing
    assert admin_client.post(page(task.id), {"status": "COMPLETED"}).status_code == 403
    assert Task.objects.get(id=task.id).status == "RUNNING"
    assert admin_client.get(page(uuid.uuid4())).status_code == 404


def test_finished_task_page_has_no_live_tail(admin_client):
    run = TaskRunFactory(status="COMPLETED", task__status="COMPLETED")
    html = admin_client.get(page(run.task_id)).content.decode()
    assert "data-live-tail" not in html and "live-tail.js" not in html and 'id="vk-replay"' not in html


def test_cancel_from_the_task_page(admin_client):
    task = TaskFactory()
    r = admin_client.post(f"/admin/tasks/task/{task.id}/cancel/", follow=True)
    assert Task.objects.get(id=task.id).status == "CANCELLED"
    assert "Task cancelled." in r.content.decode()
    r = admin_client.post(f"/admin/tasks/task/{task.id}/cancel/", follow=True)
    assert "only PENDING, DISPATCHING, RUNNING tasks can be cancelled" in r.content.decode()
    assert admin_client.get(f"/admin/tasks/task/{task.id}/cancel/").status_code == 405


def test_replay_from_the_task_page_links_both_ways(admin_client):
    original = TaskFactory(status="FAILED", input={"x": 1}, metadata={"m": 2}, priority=3)
    r = admin_client.post(f"/admin/tasks/task/{original.id}/replay/")
    new = Task.objects.get(replayed_from_task=original)
    assert r.status_code == 302 and r["Location"] == page(new.id)
    assert (new.status, new.input, new.metadata, new.priority) == ("PENDING", {"x": 1}, {"m": 2}, 3)
    assert str(new.id) in admin_client.get(page(original.id)).content.decode()
    assert str(original.id) in admin_client.get(page(new.id)).content.decode()
    completed = TaskFactory(status="COMPLETED")
    r = admin_client.post(f"/admin/tasks/task/{completed.id}/replay/", follow=True)
    assert "can be replayed" in r.content.decode() and not Task.objects.filter(replayed_from_task=completed).exists()


def test_actions_need_their_permission(staff_client):
    failed, pending = TaskFactory(status="FAILED"), TaskFactory()
    viewer = staff_client("tasks.view_task")
    html = viewer.get(page(failed.id)).content.decode()
    assert 'id="vk-replay"' not in html
    assert viewer.post(f"/admin/tasks/task/{failed.id}/replay/").status_code == 403
    assert viewer.post(f"/admin/tasks/task/{pending.id}/cancel/").status_code == 403
    assert 'id="vk-cancel"' not in viewer.get(page(pending.id)).content.decode()
    r = viewer.post(LIST, {"action": "replay_selected", "_selected_action": [failed.id], "post": "yes"})
    assert r.status_code in (200, 302)
    assert Task.objects.count() == 2 and Task.objects.get(id=pending.id).status == "PENDING"
    assert viewer.get("/admin/tasks/task/add/").status_code == 403

    replayer = staff_client("tasks.view_task", "tasks.replay_task")
    assert 'id="vk-replay"' in replayer.get(page(failed.id)).content.decode()
    assert replayer.post(f"/admin/tasks/task/{failed.id}/replay/").status_code == 302
    assert Task.objects.filter(replayed_from_task=failed).count() == 1


def test_csrf_protection_stays_on(admin_user):
    task = TaskFactory()
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(f"/admin/tasks/task/{task.id}/cancel/").status_code == 403
    assert client.post(LIST, {"action": "cancel_selected", "_selected_action": [task.id], "post": "yes"}
                       ).status_code == 403
    assert Task.objects.get(id=task.id).status == "PENDING"
    # with the token from the page, the same POST goes through
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', client.get(page(task.id)).content.decode())[1]
    client.post(f"/admin/tasks/task/{task.id}/cancel/", {"csrfmiddlewaretoken": token})
    assert Task.objects.get(id=task.id).status == "CANCELLED"


def test_bulk_cancel_asks_for_confirmation_and_reports_refusals(admin_client):
    a, b = TaskFactory(), TaskFactory(status="RUNNING")
    done = TaskFactory(status="COMPLETED")
    selected = [a.id, b.id, done.id]
    r = admin_client.post(LIST, {"action": "cancel_selected", "_selected_action": selected})
    html = r.content.decode()
    assert r.status_code == 200 and "Cancel 3 tasks?" in html and 'name="post" value="yes"' in html
    assert Task.objects.filter(status="CANCELLED").count() == 0
    r = admin_client.post(LIST, {"action": "cancel_selected", "_selected_action": selected, "post": "yes"},
                          follow=True)
    assert set(Task.objects.filter(status="CANCELLED").values_list("id", flat=True)) == {a.id, b.id}
    html = r.content.decode().lower()
    assert "cancelled 2 tasks." in html and f"task {done.id} is completed" in html


def test_bulk_replay(admin_client):
    failed, cancelled = TaskFactory(status="FAILED"), TaskFactory(status="CANCELLED")
    selected = [failed.id, cancelled.id]
    assert "Replay 2 tasks?" in admin_client.post(LIST, {"action": "replay_selected",
                                                         "_selected_action": selected}).content.decode()
    admin_client.post(LIST, {"action": "replay_selected", "_selected_action": selected, "post": "yes"})
    assert set(Task.objects.filter(status="PENDING").values_list("replayed_from_task_id", flat=True)) == set(selected)


def test_create_task_form_goes_through_the_service_layer(admin_client):
    assert admin_client.get("/admin/tasks/task/add/").status_code == 200
    form = {"task_name": "mail.send", "queue": "emails", "input": '{"to": "a@example.com"}',
            "metadata": '{"source": "console"}', "priority": "2", "idempotency_key": "welcome-1",
            "concurrency_key": "customer-9"}
    r = admin_client.post("/admin/tasks/task/add/", form)
    task = Task.objects.get(idempotency_key="welcome-1")
    assert r.status_code == 302 and r["Location"] == page(task.id)
    assert (task.queue, task.input, task.metadata, task.priority, task.status, task.concurrency_key) == (
        "emails", {"to": "a@example.com"}, {"source": "console"}, 2, "PENDING", "customer-9")
    # the same idempotency key does not create a second task
    r = admin_client.post("/admin/tasks/task/add/", {**form, "input": '{"to": "b@example.com"}'}, follow=True)
    assert Task.objects.count() == 1 and "exists already" in r.content.decode()
    # the service's validation errors land on the form's fields
    r = admin_client.post("/admin/tasks/task/add/", {"task_name": "t", "queue": "bad queue!", "timeout_seconds": "0"})
    assert r.status_code == 200 and Task.objects.count() == 1
    assert "may contain only letters" in r.content.decode()
    assert "queue" in r.context["form"].errors
    r = admin_client.post("/admin/tasks/task/add/", {"task_name": "t", "queue": "q", "metadata": "[1]"})
    assert "must be a JSON object" in r.content.decode() and Task.objects.count() == 1
    r = admin_client.post("/admin/tasks/task/add/", {"task_name": "t", "queue": "q", "input": "{nope"})
    assert "input" in r.context["form"].errors and Task.objects.count() == 1


def test_task_page_shows_its_trace_and_each_traced_line_s_span(admin_client):
    traced = TaskFactory(status="COMPLETED", metadata={
        "valka.traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    run = TaskRunFactory(task=traced, status="COMPLETED")
    TaskLogFactory(run=run, message="sent", metadata={"trace_id": "0af7651916cd43dd8448eb211c80319c",
                                                       "span_id": "00f067aa0ba902b7", "to": "ada"})
    TaskLogFactory(run=run, message="plain", metadata={"n": 1})
    html = admin_client.get(page(traced.id)).content.decode()
    fact = re.search(r'<dd id="vk-trace">(.*?)</dd>', html, re.S).group(1)
    assert "0af7651916cd43dd8448eb211c80319c" in fact and "b7ad6b7169203331" in fact
    lines = re.findall(r'<div class="vk-log [^"]*" data-id="\d+">(.*?)</div>', html, re.S)
    assert 'title="trace 0af7651916cd43dd8448eb211c80319c">span 00f067aa0ba902b7</span>' in lines[0]
    assert "vk-log-span" not in lines[1]
    for metadata in ({}, {"valka.traceparent": "00-garbage"}):
        plain = TaskFactory(status="COMPLETED", metadata=metadata)
        html = admin_client.get(page(plain.id)).content.decode()
        assert re.search(r'<dd id="vk-trace">(.*?)</dd>', html, re.S).group(1) == "—"
