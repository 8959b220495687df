"""The pools every long-running process opens (`valka.db.make_pool`): batches of values
(`valka.arrays.BinaryArray`) go out in binary."""

import asyncio
import time

import pytest
from django.db import connection
from psycopg.pq import Format
from psycopg_pool import AsyncConnectionPool

from valka import db
from valka.arrays import BinaryArray
from valka.db import make_pool

pytestmark = pytest.mark.django_db(transaction=True)


def test_pool_connections_send_batches_in_binary_and_others_as_text():
    """A BinaryArray goes out in binary from the pools (each element dumped in C) and as text from
    any other connection; either way PostgreSQL reads the same values."""
    ids = BinaryArray(["0190c2a4-58c3-7b3e-9d6a-1c2f3e4d5a6b", None])
    query = "SELECT %s::uuid[]"

    async def scenario() -> tuple[Format, list]:
        pool = make_pool("arrays-test", min_size=1, max_size=1)
        await pool.open()
        try:
            async with pool.connection() as conn:
                cur = conn.cursor()
                await cur.execute(query, [ids])
                return cur._query.formats[0], (await cur.fetchone())[0]
        finally:
            await pool.close()

    fmt, values = asyncio.run(scenario())
    assert fmt == Format.BINARY
    with connection.cursor() as cur:
        cur.execute(query, [ids])
        assert cur.fetchone()[0] == values
    assert [str(v) if v else v for v in values] == list(ids)


@pytest.mark.timeout(120)
def test_a_borrower_waiting_through_an_outage_gets_a_connection_soon_after_it(own_cluster):
    """A pool whose database went away gives up each connection it fails to make. A borrower
    already waiting then got nothing until its timeout ran out (ten seconds), however soon the
    database came back: a dispatcher's claimer claimed nothing for that long after a restart."""
    async def scenario() -> float:
        pool = AsyncConnectionPool(own_cluster.url, min_size=1, max_size=2, open=False, **db.RECONNECTING)
        await pool.open(wait=True)
        try:
            own_cluster.stop("fast")
            await pool.check()  # finds its connection broken, fails to make another, gives up
            waiting = asyncio.create_task(pool.getconn())  # a loop's borrow during the outage
            await asyncio.sleep(2)
            own_cluster.start()
            back = time.monotonic()
            conn = await waiting
            got = time.monotonic() - back
            await pool.putconn(conn)
            return got
        finally:
            await pool.close()

    assert asyncio.run(scenario()) < 5  # within a few seconds, not the borrower's whole timeout
