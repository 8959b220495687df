"""The pools every long-running process opens (`valka.db.make_pool`): batches of values
(`valka.arrays.BinaryArray`) go out in binary."""

import asyncio

import pytest
from django.db import connection
from psycopg.pq import Format

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
