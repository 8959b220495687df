"""Async PostgreSQL access for the long-running processes (dispatcher, scheduler) and LISTEN feeds.

They use psycopg directly (not the ORM) on the hot path; the connection
parameters are Django's, so one DATABASE_URL configures everything.
"""

from __future__ import annotations

import time

from django.db import connections
from psycopg import AsyncConnection
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from valka import arrays


def conninfo(alias: str = "default", application_name: str = "valka") -> str:
    s = connections.databases[alias]
    params = {
        "dbname": s.get("NAME"),
        "user": s.get("USER") or None,
        "password": s.get("PASSWORD") or None,
        "host": s.get("HOST") or None,
        "port": str(s.get("PORT")) if s.get("PORT") else None,
        "application_name": application_name,
    }
    for key in ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout"):
        if key in s.get("OPTIONS", {}):
            params[key] = s["OPTIONS"][key]
    params.setdefault("connect_timeout", "10")
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})


IDLE_CHECK_AFTER = 2.0  # seconds


async def _mark_returned(conn: AsyncConnection) -> None:
    conn._valka_returned_at = time.monotonic()  # type: ignore[attr-defined]


async def _check_if_idle(conn: AsyncConnection) -> None:
    """Check a connection on borrow only if it sat idle a while: a busy connection was just used
    successfully, and a round trip per borrow would double the hot path's statements. After a
    PostgreSQL restart the first borrow of each idle connection finds it dead and replaces it."""
    if time.monotonic() - getattr(conn, "_valka_returned_at", 0.0) > IDLE_CHECK_AFTER:
        await AsyncConnectionPool.check_connection(conn)


def make_pool(application_name: str, min_size: int = 1, max_size: int = 4, *,
              session: str = "") -> AsyncConnectionPool:
    """A pool that checks idle connections on borrow, so a PostgreSQL restart heals itself.

    `session` is SQL run once on each new connection (settings for a pool that runs one
    kind of statement, such as the dispatcher's claims). Its connections send
    `valka.arrays.BinaryArray` parameters in binary.
    """

    async def configure(conn: AsyncConnection) -> None:
        arrays.register(conn.adapters)
        if session:
            await conn.execute(session)

    return AsyncConnectionPool(
        conninfo(application_name=application_name),
        min_size=min_size,
        max_size=max_size,
        open=False,
        check=_check_if_idle,
        reset=_mark_returned,
        configure=configure,
        kwargs={"autocommit": True},
        reconnect_timeout=0,  # keep trying forever; the loops back off and log
        timeout=10,
    )
