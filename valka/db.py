"""Async PostgreSQL access for the long-running processes (dispatcher, scheduler) and LISTEN feeds.

They use psycopg directly (not the ORM) on the hot path; the connection
parameters are Django's, so one DATABASE_URL configures everything. The
connections that need a session of their own (LISTEN, the scheduler's leader
lock, the dispatcher's claims) may take VALKA_DIRECT_DATABASE_URL instead,
for when DATABASE_URL leads through a transaction pooler (valka/poolers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import environ
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connections
from psycopg import AsyncConnection
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolClosed

from valka import arrays
from valka.conf import valka_settings


def conninfo(alias: str = "default", application_name: str = "valka", *, direct: bool = False) -> str:
    """libpq parameters for Django's database `alias`. `direct`: for a connection whose session
    must be its own from start to end (LISTEN, an advisory lock, session settings, prepared
    statements), which a transaction pooler would share out between transactions: it goes to
    VALKA_DIRECT_DATABASE_URL when that is set."""
    s = connections.databases[alias]
    if direct and alias == "default" and valka_settings.DIRECT_DATABASE_URL:
        s = environ.Env.db_url_config(valka_settings.DIRECT_DATABASE_URL)
        if s.get("ENGINE") != "django.db.backends.postgresql":
            raise ImproperlyConfigured("VALKA_DIRECT_DATABASE_URL must point at PostgreSQL")
    options = s.get("OPTIONS") or {}
    params = {
        "dbname": s.get("NAME"),
        "user": s.get("USER") or None,
        "password": s.get("PASSWORD") or None,
        "host": s.get("HOST") or None,
        "port": str(s.get("PORT")) if s.get("PORT") else None,
        "application_name": application_name,
    }
    for key in ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout"):
        if key in options:
            params[key] = str(options[key])
    params.setdefault("connect_timeout", "10")
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})


def prepared_statements(alias: str = "default") -> bool:
    """Whether connections through DATABASE_URL may keep prepared statements
    (VALKA_DB_PREPARED_STATEMENTS, which settings.py turns into Django's `prepare_threshold`)."""
    return "prepare_threshold" in (connections.databases[alias].get("OPTIONS") or {})


# How long the long-running loops (the dispatcher's claimer, writer and LISTEN connection, the
# scheduler's election) wait before they try the database again after it failed them: doubling from
# a first wait of their own, to at most a second. While the database is away that costs one failed
# attempt a second per loop; once it is back, every loop finds it within a second (with five
# seconds at most, a loop could sleep for seconds past its return).
RETRY_WAIT_MOST = 1.0  # seconds


def next_retry_wait(wait: float) -> float:
    return min(wait * 2, RETRY_WAIT_MOST)


IDLE_CHECK_AFTER = 2.0  # seconds


async def _mark_returned(conn: AsyncConnection) -> None:
    conn._valka_returned_at = time.monotonic()  # type: ignore[attr-defined]


async def _check_if_idle(conn: AsyncConnection) -> None:
    """Check a connection on borrow only if it sat idle a while: a busy connection was just used
    successfully, and a round trip per borrow would double the hot path's statements. After a
    PostgreSQL restart the first borrow of each idle connection finds it dead and replaces it."""
    if time.monotonic() - getattr(conn, "_valka_returned_at", 0.0) > IDLE_CHECK_AFTER:
        await AsyncConnectionPool.check_connection(conn)


async def _try_again_soon(pool: AsyncConnectionPool) -> None:
    """The pool gave up a connection it could not make (the database is away). It tries again only
    when a new borrower comes: one already waiting would wait out its whole timeout, though the
    database came back a second later (a dispatcher claimed nothing for ten seconds after a
    restart). So look again in a second, which makes a new attempt while a connection is missing."""
    async def later() -> None:
        await asyncio.sleep(RETRY_WAIT_MOST)
        if not pool.closed:
            with contextlib.suppress(PoolClosed):  # closed meanwhile
                await pool.check()

    retries: set[asyncio.Task] = pool.__dict__.setdefault("_valka_retries", set())
    if not retries:  # one at a time
        task = asyncio.get_running_loop().create_task(later())
        retries.add(task)
        task.add_done_callback(retries.discard)


# How every pool of make_pool waits for a connection and makes new ones after a failure: a borrower
# waits at most ten seconds; a failed attempt gives up at once, and _try_again_soon makes the next.
RECONNECTING: dict[str, Any] = {"timeout": 10, "reconnect_timeout": 0, "reconnect_failed": _try_again_soon}


def make_pool(application_name: str, min_size: int = 1, max_size: int = 4, *,
              session: str = "", direct: bool = False) -> AsyncConnectionPool:
    """A pool that checks idle connections on borrow, so a PostgreSQL restart heals itself.

    `session` is SQL run once on each new connection (settings for a pool that runs one
    kind of statement, such as the dispatcher's claims). `direct`: its connections need
    sessions of their own (see `conninfo`). Its connections send
    `valka.arrays.BinaryArray` parameters in binary. psycopg prepares a statement it runs
    often; a pool through DATABASE_URL does not when VALKA_DB_PREPARED_STATEMENTS is off, as
    a pooler that cannot keep them would hand the next execution to a session without it.
    """

    async def configure(conn: AsyncConnection) -> None:
        arrays.register(conn.adapters)
        if session:
            await conn.execute(session)

    kwargs: dict[str, Any] = {"autocommit": True}
    if not direct and not prepared_statements():
        kwargs["prepare_threshold"] = None
    return AsyncConnectionPool(
        conninfo(application_name=application_name, direct=direct),
        min_size=min_size,
        max_size=max_size,
        open=False,
        check=_check_if_idle,
        reset=_mark_returned,
        configure=configure,
        kwargs=kwargs,
        **RECONNECTING,
    )


def in_thread[T](fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """`fn`, a sync call that uses Django's database, made awaitable: it runs in a worker thread on
    a connection held only for the call, then given back (to the pool, or closed). A stream that
    waits between its reads (an event stream, a log tail, a gRPC subscription) holds none meanwhile."""

    def call(*args: Any, **kwargs: Any) -> T:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(call, thread_sensitive=False)
