"""The web floor: what the HTTP server of the web app and an async PostgreSQL pool alone do for
one enqueue over HTTP, with no Django, no DRF and no authentication.

`uvicorn bench.web_floor:app`, started as the web app is (httptools, uvloop, the same number of
processes), answers `POST /` by inserting the JSON body into the floor's bare table (`floor_jobs`,
made by bench/floor.py's rounds, which come first) with a NOTIFY on the floors' channel, one commit
per request, and returning the new row's id as JSON. The REST create is held to the database's
own floor; this one says how much of the gap HTTP in Python takes before any framework runs.
`BENCH_FLOOR_URL` names the database.
"""

from __future__ import annotations

import json
import os
from typing import Any

from psycopg_pool import AsyncConnectionPool

INSERT = """
WITH i AS (INSERT INTO floor_jobs (queue, status, payload) VALUES ('web', 'pending', %s) RETURNING id, queue)
SELECT id, pg_notify('floor_ready', queue) FROM i
"""

_pool: AsyncConnectionPool | None = None


async def _lifespan(receive: Any, send: Any) -> None:
    """The pool opens before the server takes requests, as the web app's connections are open
    before a round starts."""
    global _pool
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            _pool = AsyncConnectionPool(os.environ["BENCH_FLOOR_URL"], min_size=8, max_size=8,
                                        kwargs={"autocommit": True}, open=False)
            await _pool.open(wait=True)
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if _pool is not None:
                await _pool.close()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["method"] == "POST":
        json.loads(body)  # as a server must, to know what it stores
        assert _pool is not None
        async with _pool.connection() as conn:
            row = await (await conn.execute(INSERT, (body.decode(),))).fetchone()
        status, answer = 201, json.dumps({"id": row[0]}).encode()
    else:
        status, answer = 200, b"{}"
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": answer})
