"""The console's Queues page: what it shows, pause and resume (tasks.pause_queue) and the limits form
(tasks.change_queue), each behind its own permission; and the overview's paused queues and limits."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tasks.models import Queue, Worker
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

PAGE = "/admin/tasks/queue/"


def _queue(name: str = "mail", **settings) -> Queue:
    TaskFactory(queue=name, status="PENDING")
    TaskFactory(queue=name, status="RUNNING")
    Queue.objects.filter(name=name).update(**settings)
    return Queue.objects.get(name=name)


def test_the_page_shows_every_queue_with_its_counts_running_limits_and_pause(admin_client):
    _queue("mail", max_running=5, rate_limit=20, max_running_per_key=2, description="outgoing mail",
           paused=True, paused_until=timezone.now() + timedelta(hours=1))
    Worker.objects.create(id="w", queues=["idle"], concurrency=2)
    html = admin_client.get(PAGE).content.decode()
    assert 'data-queue="mail"' in html and 'data-queue="idle"' in html
    assert "PAUSED" in html and "until" in html and "outgoing mail" in html
    assert "1 / 5" in html, "running against max_running"
    assert "5 running · 20 per 1 s · 2 per key" in html
    assert 'value="Resume"' in html


def test_a_viewer_sees_the_page_but_no_action(staff_client):
    _queue()
    viewer = staff_client("tasks.view_queue")
    html = viewer.get(PAGE).content.decode()
    assert 'data-queue="mail"' in html and 'value="Pause"' not in html
    assert viewer.post(f"{PAGE}mail/pause/").status_code == 403
    assert viewer.post(f"{PAGE}mail/limits/", {"rate_period_seconds": 1, "max_running": 3}).status_code == 403
    queue = Queue.objects.get(name="mail")
    assert (queue.paused, queue.max_running) == (False, None), "a refused POST wrote nothing"
    assert staff_client().get(PAGE).status_code == 403


def test_pause_and_resume_need_their_permission_and_only_theirs(staff_client):
    _queue()
    limits_only = staff_client("tasks.view_queue", "tasks.change_queue")
    assert limits_only.post(f"{PAGE}mail/pause/").status_code == 403
    pauser = staff_client("tasks.view_queue", "tasks.pause_queue")
    until = (timezone.now() + timedelta(minutes=30)).strftime("%Y-%m-%d %H:%M:%S")
    assert pauser.post(f"{PAGE}mail/pause/", {"until": until}).status_code == 302
    queue = Queue.objects.get(name="mail")
    assert queue.paused and queue.paused_until.strftime("%Y-%m-%d %H:%M:%S") == until
    assert pauser.post(f"{PAGE}mail/resume/").status_code == 302
    assert not Queue.objects.get(name="mail").paused
    assert pauser.post(f"{PAGE}mail/limits/", {"rate_period_seconds": 1, "max_running": 3}).status_code == 403


def test_a_pause_in_the_past_is_refused_with_a_message(admin_client):
    _queue()
    response = admin_client.post(f"{PAGE}mail/pause/", {"until": "2001-01-01 00:00"}, follow=True)
    assert "must be in the future" in response.content.decode()
    assert not Queue.objects.get(name="mail").paused


def test_the_limits_form_saves_through_the_service_layer(staff_client):
    _queue(max_running=4)
    changer = staff_client("tasks.view_queue", "tasks.change_queue")
    form = changer.get(f"{PAGE}mail/limits/").content.decode()
    assert 'name="max_running"' in form and 'value="4"' in form
    response = changer.post(f"{PAGE}mail/limits/", {"max_running": "", "rate_limit": "10", "rate_period_seconds": "60",
                                                     "max_running_per_key": "", "description": "slow API"})
    assert response.status_code == 302
    queue = Queue.objects.get(name="mail")
    assert (queue.max_running, queue.rate_limit, queue.rate_period_seconds, queue.description) == (
        None, 10, 60, "slow API"), "an emptied limit is removed"


def test_bad_limits_are_shown_on_the_form_and_nothing_is_written(admin_client):
    _queue(max_running=4)
    response = admin_client.post(f"{PAGE}mail/limits/", {"max_running": "0", "rate_period_seconds": "1"})
    assert response.status_code == 200 and "errornote" in response.content.decode()
    response = admin_client.post(f"{PAGE}mail/limits/", {"max_running": "3", "rate_period_seconds": "0"})
    assert response.status_code == 200
    assert Queue.objects.get(name="mail").max_running == 4


def test_an_unknown_queue_goes_back_to_the_list(admin_client):
    assert admin_client.get(f"{PAGE}ghost/limits/", follow=True).redirect_chain[-1][0] == PAGE
    assert admin_client.post(f"{PAGE}ghost/pause/").status_code == 302
    assert not Queue.objects.exists()


def test_the_overview_shows_paused_queues_and_limits(admin_client):
    _queue("mail", max_running=5, paused=True)
    _queue("open")
    html = admin_client.get("/admin/").content.decode()
    row = html[html.index('data-queue="mail"'):html.index('data-queue="open"')]
    assert "PAUSED" in row and "5 running" in row
    assert "PAUSED" not in html[html.index('data-queue="open"'):]
