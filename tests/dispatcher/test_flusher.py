"""The dispatcher's writer against the test database, without gRPC."""

import asyncio

import pytest

from dispatcher.flusher import Result
from dispatcher.node import DispatcherNode, NodeSettings
from tasks.models import Task
from tests.factories import TaskRunFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _settings() -> NodeSettings:
    return NodeSettings(node_id="test-node", lease_extension=60, poll_interval=1, drain_seconds=1,
                        worker_token="", retry_params={"retry_base": 1, "retry_cap": 10, "retry_jitter": 0.25})


def test_a_row_postgresql_refuses_does_not_hold_back_the_others():
    good = TaskRunFactory(worker_id="w")
    bad = TaskRunFactory(worker_id="w")

    async def scenario():
        node = DispatcherNode(_settings())
        await node.pool.open()
        stop = asyncio.Event()
        runner = asyncio.create_task(node.flusher.run(stop))
        # A value that slipped past validation: PostgreSQL cannot cast it to jsonb.
        node.flusher.result(Result(str(bad.id), "w", True, False, "{not json", None))
        node.flusher.result(Result(str(good.id), "w", True, False, '{"ok": true}', None))
        for _ in range(200):
            await asyncio.sleep(0.05)
            if not node.flusher.pending():
                break
        stop.set()
        await runner
        await node.pool.close()

    asyncio.run(scenario())
    done = Task.objects.get(id=good.task_id)
    assert done.status == "COMPLETED" and done.output == {"ok": True}
    refused = Task.objects.get(id=bad.task_id)
    assert refused.status == "FAILED" and "could not be stored" in refused.error_message
