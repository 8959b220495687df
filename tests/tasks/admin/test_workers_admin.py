"""The workers page: queues, node, in-flight runs and free slots, connected or not."""

import pytest
from django.utils import timezone

from tests.factories import TaskRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db


def test_workers_page_shows_in_flight_and_free_slots(admin_client):
    busy = WorkerFactory(name="busy-host", concurrency=3, queues=["emails", "reports"], node_id="node-7")
    TaskRunFactory.create_batch(2, worker_id=busy.id)
    gone = WorkerFactory(name="gone-host", status="DISCONNECTED", disconnected_at=timezone.now())
    html = admin_client.get("/admin/tasks/worker/").content.decode()
    row = html[html.index("busy-host"):html.index("</tr>", html.index("busy-host"))]
    assert "emails, reports" in row and "node-7" in row and "vk-connected" in row
    assert '<td class="field-in_flight">2</td>' in row and '<td class="field-free_slots">1</td>' in row
    assert "gone-host" in html and "vk-disconnected" in html
    assert admin_client.get(f"/admin/tasks/worker/{gone.id}/change/").status_code == 200
