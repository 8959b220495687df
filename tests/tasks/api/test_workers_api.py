"""GET /api/v1/workers."""

import pytest

from tests.factories import WorkerFactory

pytestmark = pytest.mark.django_db


def test_workers_list(client_api):
    WorkerFactory(id="w-1", queues=["a", "b"])
    body = client_api.get("/api/v1/workers").json()
    assert body["count"] == 1 and body["results"][0]["worker_id"] == "w-1"
    assert body["results"][0]["queues"] == ["a", "b"]
