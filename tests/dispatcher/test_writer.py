"""The dispatcher's writer against the test database, without gRPC."""

import asyncio

import pytest

from dispatcher import sql
from dispatcher.protocol import Result
from dispatcher.relay import Relay
from dispatcher.session import SessionRegistry
from dispatcher.writer import Writer, WriterSettings
from tasks.models import Task
from tests.factories import TaskRunFactory
from valka.db import make_pool

pytestmark = pytest.mark.django_db(transaction=True)


def _writer(pool) -> Writer:
    """A writer on its own, with the collaborators a node would give it."""
    return Writer(pool=pool, relay=Relay(pool=pool, sessions=SessionRegistry()), cancel=lambda task_id, why: None,
                  settings=WriterSettings(node_id="test-node", lease_extension=60,
                                          retry_params={"retry_base": 1, "retry_cap": 10, "retry_jitter": 0.25}))


def test_a_row_postgresql_refuses_does_not_hold_back_the_others():
    good = TaskRunFactory(worker_id="w")
    bad = TaskRunFactory(worker_id="w")

    async def scenario():
        pool = make_pool("writer-test", min_size=1, max_size=2, session=sql.WRITER_SESSION)
        await pool.open()
        writer = _writer(pool)
        stop = asyncio.Event()
        runner = asyncio.create_task(writer.run(stop))
        # A value that slipped past validation: PostgreSQL cannot cast it to jsonb.
        writer.result(Result(str(bad.id), "w", True, False, "{not json", None))
        writer.result(Result(str(good.id), "w", True, False, '{"ok": true}', None))
        for _ in range(200):
            await asyncio.sleep(0.05)
            if not writer.pending():
                break
        stop.set()
        await runner
        await pool.close()

    asyncio.run(scenario())
    done = Task.objects.get(id=good.task_id)
    assert done.status == "COMPLETED" and done.output == {"ok": True}
    refused = Task.objects.get(id=bad.task_id)
    assert refused.status == "FAILED" and "could not be stored" in refused.error_message
