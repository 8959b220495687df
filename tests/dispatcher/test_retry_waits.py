"""While the database is away, the dispatcher's loops try it again at least once a second, so
that each finds it within a second of its return; with waits doubling to five seconds, a loop
could sleep for seconds past it."""

import asyncio
import logging
import re

import pytest
from psycopg_pool import AsyncConnectionPool

from dispatcher.claimer import Claimer, ClaimerSettings
from dispatcher.protocol import Result
from dispatcher.relay import Relay
from dispatcher.session import SessionRegistry
from dispatcher.writer import Writer, WriterSettings
from valka.db import RETRY_WAIT_MOST
from valka.devdb import free_port
from valka.listen import Listener

AWAY = f"host=127.0.0.1 port={free_port()} dbname=away user=away connect_timeout=1"  # nothing listens there
WATCH = 5.0  # seconds: with waits doubling from 0.1 to 5 s, the fifth and sixth would be 1.6 and 3.2 s


def _pool() -> AsyncConnectionPool:
    return AsyncConnectionPool(AWAY, min_size=0, max_size=1, timeout=0.2, open=False)


async def _claimer(stop: asyncio.Event) -> None:
    pool = _pool()
    await pool.open(wait=False)
    try:
        claimer = Claimer(pool=pool, sessions=SessionRegistry(), unsend=lambda ids: None,
                          settings=ClaimerSettings(node_id="away", poll_interval=30))
        runner = asyncio.create_task(claimer.run(stop))
        claimer.wake()  # a pass reads the queues' controls first, and fails
        await stop.wait()
        claimer.wake()  # as a stopping node does
        await runner
    finally:
        await pool.close()


async def _writer(stop: asyncio.Event) -> None:
    pool = _pool()
    await pool.open(wait=False)
    try:
        writer = Writer(pool=pool, relay=Relay(pool=pool, sessions=SessionRegistry()), cancel=lambda *a: None,
                        settings=WriterSettings(node_id="away", lease_extension=60))
        writer.result(Result("0190c2a4-58c3-7b3e-9d6a-1c2f3e4d5a6b", "w", True, False, "{}", None))
        runner = asyncio.create_task(writer.run(stop))
        await stop.wait()
        runner.cancel()  # it would keep its result until the database answers
    finally:
        await pool.close()


async def _listener(stop: asyncio.Event) -> None:
    await Listener(AWAY, {}, on_reconnect=lambda: None).run(stop)


@pytest.mark.parametrize(("loop", "logger"), [(_claimer, "valka.dispatcher"), (_writer, "valka.dispatcher"),
                                              (_listener, "valka.listen")], ids=["claimer", "writer", "listener"])
def test_a_loop_tries_the_database_again_at_least_once_a_second(loop, logger, caplog):
    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(loop(stop))
        await asyncio.sleep(WATCH)
        stop.set()
        await asyncio.wait_for(task, 10)

    with caplog.at_level(logging.WARNING, logger=logger):
        asyncio.run(scenario())
    waits = [float(m.group(1)) for r in caplog.records
             if (m := re.search(r"(?:retrying|reconnecting) in ([0-9.]+)s", r.getMessage()))]
    assert len(waits) >= 5, waits  # it kept trying
    assert max(waits) <= RETRY_WAIT_MOST, waits
