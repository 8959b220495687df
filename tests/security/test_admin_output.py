"""What people and programs typed is shown as text: the admin escapes it, /metrics quotes it."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

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


def test_metrics_quote_hostile_queue_names(client):
    # Written around the API's queue validator, as rows from elsewhere could be.
    for queue in ['a"b', "line\nbreak", "back\\slash", "x'; DROP TABLE tasks; --"]:
        TaskFactory(queue=queue)
    r = client.get("/metrics")
    assert r.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(r.content.decode())}
    queues = {s.labels["queue"] for s in families["valka_tasks"].samples}
    assert {'a"b', "line\nbreak", "back\\slash", "x'; DROP TABLE tasks; --"} <= queues
