"""The dispatcher's two pools: claims commit without waiting for the WAL flush, plan with index
probes only and once per connection; the writer's passes wait for the flush and plan freely."""

import asyncio

import pytest
from django.db import connection

from dispatcher.claimer import claim
from dispatcher.node import DispatcherNode, NodeSettings
from tasks.services import task_enqueue_many

pytestmark = pytest.mark.django_db(transaction=True)


def _settings() -> NodeSettings:
    return NodeSettings(node_id="test-node", lease_extension=60, poll_interval=1, shutdown_timeout=1, worker_token="")


@pytest.fixture
def durable_database():
    """New sessions of the test database default to synchronous_commit=on, as on a production server
    (the throwaway test cluster runs with it off)."""
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cur:
        cur.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = on')
    yield
    with connection.cursor() as cur:
        cur.execute(f'ALTER DATABASE "{name}" RESET synchronous_commit')


def test_only_claims_skip_the_flush_wait(durable_database):
    async def scenario() -> tuple[tuple, tuple]:
        node = DispatcherNode(_settings())
        await node.pool.open()
        await node.claim_pool.open()
        try:
            query = ("SELECT current_setting('synchronous_commit'), current_setting('enable_seqscan'), "
                     "current_setting('enable_hashjoin'), current_setting('enable_mergejoin'), "
                     "current_setting('plan_cache_mode')")
            async with node.claim_pool.connection() as conn:
                claims = await (await conn.execute(query)).fetchone()
            async with node.pool.connection() as conn:
                writes = await (await conn.execute(query)).fetchone()
        finally:
            await node.claim_pool.close()
            await node.pool.close()
        return claims, writes

    assert asyncio.run(scenario()) == (("off", "off", "off", "off", "force_generic_plan"),
                                       ("on", "off", "on", "on", "auto"))


def test_a_claim_connection_plans_the_claim_once():
    task_enqueue_many([{"task_name": "t", "queue": "once"}] * 3)

    async def scenario() -> tuple:
        node = DispatcherNode(_settings())
        await node.claim_pool.open()
        try:
            async with node.claim_pool.connection() as conn:
                for _ in range(3):
                    await claim(conn, queue="once", limit=1, node_id="test-node")
                cur = await conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                                         "WHERE statement LIKE %s", ["%WITH RECURSIVE priorities%"])
                return await cur.fetchone()
        finally:
            await node.claim_pool.close()

    generic, custom = asyncio.run(scenario())
    assert (generic, custom) == (3, 0)

