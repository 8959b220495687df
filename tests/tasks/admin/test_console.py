"""What every console page shares: a login is required, and the pages are read-only."""

import pytest

from tasks.models import DeadLetter, Task
from tests.factories import DeadLetterFactory

pytestmark = pytest.mark.django_db


def test_admin_requires_login(anon_client):
    r = anon_client.get("/admin/")
    assert r.status_code == 302 and "/admin/login/" in r["Location"]


def test_admin_pages_render_read_only(anon_client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", password="pw-123456")
    anon_client.force_login(admin)
    letter = DeadLetterFactory()
    for url in ["/admin/", "/admin/tasks/task/", f"/admin/tasks/task/{letter.task_id}/change/",
                "/admin/tasks/deadletter/", f"/admin/tasks/deadletter/{letter.id}/change/",
                "/admin/tasks/worker/", "/admin/tasks/taskrun/", "/admin/signals/signal/"]:
        assert anon_client.get(url).status_code == 200, url
    # No form can move a task: posting a status change is refused.
    r = anon_client.post(f"/admin/tasks/task/{letter.task_id}/change/", {"status": "PENDING"})
    assert r.status_code == 403
    assert Task.objects.get(id=letter.task_id).status == "DEAD_LETTER"
    assert DeadLetter.objects.count() == 1
