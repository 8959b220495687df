"""What people and programs typed is shown as text: the admin escapes it.

(That /metrics quotes it is tested in tests/tasks/test_metrics.py.)"""

from __future__ import annotations

import pytest

from tests.factories import DeadLetterFactory, TaskFactory

pytestmark = pytest.mark.django_db

SCRIPT = "<script>alert('x')</script>"


def test_the_admin_escapes_task_fields(admin_client):
    task = TaskFactory(task_name=SCRIPT, idempotency_key=SCRIPT, input={SCRIPT: SCRIPT}, metadata={"m": SCRIPT},
                       error_message=SCRIPT)
    letter = DeadLetterFactory(task_name=SCRIPT, error_message=SCRIPT)
    for url in ("/admin/tasks/task/", f"/admin/tasks/task/{task.id}/change/", "/admin/tasks/deadletter/",
                f"/admin/tasks/deadletter/{letter.id}/change/", "/admin/"):
        r = admin_client.get(url)
        assert r.status_code == 200, url
        html = r.content.decode()
        assert SCRIPT not in html, url
    assert "&lt;script&gt;" in admin_client.get(f"/admin/tasks/task/{task.id}/change/").content.decode()
