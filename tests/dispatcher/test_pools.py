"""The dispatcher's two pools: claims commit without waiting for the WAL flush, plan with index
probes only and once per connection; the writer's passes wait for the flush and plan freely.
The claim says so for its own transaction only: nothing of it stays with the session, which a
pooler could hand to another client (valka/poolers.py)."""

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


def test_only_claims_skip_the_flush_wait_and_only_for_their_own_transaction(durable_database):
    task_enqueue_many([{"task_name": "t", "queue": "durable"}])
    settings = ("SELECT current_setting('synchronous_commit'), current_setting('enable_seqscan'), "
                "current_setting('enable_hashjoin'), current_setting('enable_mergejoin'), "
                "current_setting('plan_cache_mode')")

    async def scenario() -> dict:
        node = DispatcherNode(_settings())
        await node.pool.open()
        await node.claim_pool.open()
        seen = {}
        try:
            async with node.claim_pool.connection() as conn:
                async with conn.transaction():
                    seen["claimed"] = len(await claim(conn, queue="durable", limit=1, node_id="test-node"))
                    seen["during"] = (await (await conn.execute("SHOW synchronous_commit")).fetchone())[0]
                await claim(conn, queue="durable", limit=1, node_id="test-node")  # a claim of nothing, too
                seen["claims"] = await (await conn.execute(settings)).fetchone()
            async with node.pool.connection() as conn:
                seen["writes"] = await (await conn.execute(settings)).fetchone()
        finally:
            await node.claim_pool.close()
            await node.pool.close()
        return seen

    assert asyncio.run(scenario()) == {"claimed": 1, "during": "off",
                                       "claims": ("on", "off", "off", "off", "force_generic_plan"),
                                       "writes": ("on", "off", "on", "on", "auto")}


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
                                         "WHERE statement LIKE %s", ["%WITH RECURSIVE open AS%"])
                return await cur.fetchone()
        finally:
            await node.claim_pool.close()

    generic, custom = asyncio.run(scenario())
    assert (generic, custom) == (3, 0)

