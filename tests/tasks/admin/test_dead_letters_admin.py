"""Dead letters in the console: list, page, replay (single, again, bulk), delete, permissions."""

import re

import pytest
from django.utils import timezone

from tasks.models import DeadLetter, Task
from tests.factories import DeadLetterFactory, TaskLogFactory, TaskRunFactory

pytestmark = pytest.mark.django_db

LIST = "/admin/tasks/deadletter/"


def page(letter_id):
    return f"/admin/tasks/deadletter/{letter_id}/change/"


def shown(client, query=""):
    return set(re.findall(r"/admin/tasks/deadletter/([0-9a-f-]{36})/change/",
                          client.get(LIST + query).content.decode()))


def test_list_columns_filters_and_search(admin_client):
    a = DeadLetterFactory(task__queue="emails", error_message="SMTP 451 temporary failure")
    b = DeadLetterFactory(task__queue="reports", error_message="division by zero",
                          replayed_at=timezone.now(), replay_count=1)
    html = admin_client.get(LIST).content.decode()
    for text in ("emails", a.task_name, "SMTP 451 temporary failure", "reports", "1× , "):
        assert text in html
    assert shown(admin_client, "?queue=emails") == {str(a.id)}
    assert shown(admin_client, "?replayed=no") == {str(a.id)}
    assert shown(admin_client, "?replayed=yes") == {str(b.id)}
    assert shown(admin_client, "?q=division") == {str(b.id)}
    assert shown(admin_client, f"?q={a.task_id}") == {str(a.id)}
    assert shown(admin_client, f"?q={b.id}") == {str(b.id)}
    assert shown(admin_client, f"?q={a.task_name}") == {str(a.id)}


def test_page_shows_payloads_last_error_and_every_run(admin_client):
    letter = DeadLetterFactory(input={"invoice": 42}, metadata={"tenant": "acme"}, error_message="final boom")
    for attempt, error in ((1, "first boom"), (2, "second boom")):
        run = TaskRunFactory(task=letter.task, attempt_number=attempt, status="FAILED", error_message=error)
        TaskLogFactory(run=run, level="ERROR", message=f"log of attempt {attempt}")
    html = admin_client.get(page(letter.id)).content.decode()
    for text in ("&quot;invoice&quot;: 42", "&quot;tenant&quot;: &quot;acme&quot;", "final boom", "first boom",
                 "second boom", "log of attempt 1", "log of attempt 2", 'id="vk-replay"'):
        assert text in html, text
    assert admin_client.post(page(letter.id), {"error_message": "x"}).status_code == 403


def test_replay_once_then_again_only_after_confirmation(admin_client):
    letter = DeadLetterFactory(input={"x": 1})
    r = admin_client.post(f"/admin/tasks/deadletter/{letter.id}/replay/")
    first = Task.objects.get(replayed_from_dead_letter=letter)
    assert r.status_code == 302 and r["Location"] == f"/admin/tasks/task/{first.id}/change/"
    assert (first.status, first.input, first.replayed_from_task_id) == ("PENDING", {"x": 1}, letter.task_id)
    letter.refresh_from_db()
    assert letter.replay_task_id == first.id and letter.replay_count == 1 and letter.replayed_at

    # again: a confirmation page first, nothing created
    r = admin_client.post(f"/admin/tasks/deadletter/{letter.id}/replay/")
    html = r.content.decode()
    assert r.status_code == 200 and "Replay this dead letter again?" in html and "replayed 1 time(s)" in html
    assert Task.objects.filter(replayed_from_dead_letter=letter).count() == 1
    r = admin_client.post(f"/admin/tasks/deadletter/{letter.id}/replay/", {"post": "yes"})
    assert r.status_code == 302 and Task.objects.filter(replayed_from_dead_letter=letter).count() == 2
    letter.refresh_from_db()
    assert letter.replay_count == 2 and str(letter.replay_task_id) in r["Location"]
    assert "Replay again" in admin_client.get(page(letter.id)).content.decode()


def test_bulk_replay_warns_about_letters_replayed_before(admin_client):
    fresh, done = DeadLetterFactory(), DeadLetterFactory(replayed_at=timezone.now(), replay_count=1)
    data = {"action": "replay_selected", "_selected_action": [fresh.id, done.id]}
    html = admin_client.post(LIST, data).content.decode()
    assert "Replay 2 dead letters?" in html and "1 of them were replayed already" in html
    assert not Task.objects.filter(replayed_from_dead_letter__isnull=False).exists()
    admin_client.post(LIST, {**data, "post": "yes"})
    assert Task.objects.filter(replayed_from_dead_letter__in=[fresh, done], status="PENDING").count() == 2
    assert DeadLetter.objects.get(id=done.id).replay_count == 2


def test_delete_selected(admin_client):
    keep, gone = DeadLetterFactory(), DeadLetterFactory()
    admin_client.post(f"/admin/tasks/deadletter/{gone.id}/replay/")
    data = {"action": "delete_selected", "_selected_action": [gone.id]}
    assert "Are you sure" in admin_client.post(LIST, data).content.decode()
    admin_client.post(LIST, {**data, "post": "yes"})
    assert list(DeadLetter.objects.values_list("id", flat=True)) == [keep.id]
    assert Task.objects.get(replayed_from_task=gone.task_id).replayed_from_dead_letter_id is None


def test_replay_and_delete_need_their_permissions(staff_client):
    letter = DeadLetterFactory()
    viewer = staff_client("tasks.view_deadletter")
    html = viewer.get(page(letter.id)).content.decode()
    assert 'id="vk-replay"' not in html and "deletelink" not in html
    assert viewer.post(f"/admin/tasks/deadletter/{letter.id}/replay/").status_code == 403
    assert 'value="replay_selected"' not in viewer.get(LIST).content.decode()
    viewer.post(LIST, {"action": "replay_selected", "_selected_action": [letter.id], "post": "yes"})
    viewer.post(LIST, {"action": "delete_selected", "_selected_action": [letter.id], "post": "yes"})
    assert DeadLetter.objects.filter(id=letter.id, replayed_at__isnull=True).exists()
    assert not Task.objects.filter(replayed_from_dead_letter=letter).exists()

    replayer = staff_client("tasks.view_deadletter", "tasks.replay_deadletter")
    assert 'value="replay_selected"' in replayer.get(LIST).content.decode()
    assert replayer.post(f"/admin/tasks/deadletter/{letter.id}/replay/").status_code == 302
    assert Task.objects.filter(replayed_from_dead_letter=letter).count() == 1
