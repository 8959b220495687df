"""Whether a connection leads through a transaction pooler, and the refusal to start if it does.

LISTEN, the scheduler's advisory lock and the claim connections' settings live in a session.
A transaction (or statement) pooler such as PgBouncer in transaction mode lends a server
session to a client for one transaction only: a LISTEN then hears nothing, a lock is held by a
session nobody watches, and a SET lands on whoever gets that session next. None of that fails
loudly, so the dispatcher and the scheduler look before they start, on the connection those
features will use (VALKA_DIRECT_DATABASE_URL, or DATABASE_URL without it).

The look cannot be fooled into seeing a pooler where there is none: two clients connect at once
and each asks, several times and in turns, which server session it runs on (its process id, and
the server's start time, in case a load balancer spreads connections over several servers). Two
live sessions never share a process, and a session never changes its process; either sight
proves that the clients' transactions are served by whichever server session is free (PgBouncer
hands the one just released to the next client). The turns (A, B, A, A, B, B)
catch a pooler that hands out the most recently released session as well as one that takes the
longest idle. A session pooler gives each client a server session of its own, which is all that
is needed, and is not reported.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg

from valka.conf import valka_settings
from valka.db import conninfo

log = logging.getLogger("valka.poolers")

TURNS = (0, 1, 0, 0, 1, 1)  # which of the two clients asks, in order
SESSION = "SELECT pg_backend_pid(), pg_postmaster_start_time()"  # which server session runs this
CHECK_TIMEOUT = 5.0  # seconds the whole look may take; past it, the process starts without an answer


async def _sessions(dsn: str) -> list[tuple[int, Any]]:
    """(client, server session) for each turn, each asked in a transaction of its own."""
    opened = await asyncio.gather(*(psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(2)),
                                  return_exceptions=True)
    clients = [c for c in opened if isinstance(c, psycopg.AsyncConnection)]
    try:
        for failed in opened:
            if isinstance(failed, BaseException):
                raise failed
        seen = []
        for turn in TURNS:
            cur = await clients[turn].execute(SESSION)
            seen.append((turn, await cur.fetchone()))
        return seen
    finally:
        for client in clients:
            await client.close()


def pooled(seen: list[tuple[int, Any]]) -> bool:
    """Whether the server sessions the clients saw prove a pooler (see the module's docstring)."""
    first: dict[int, Any] = {}
    for client, session in seen:
        if first.setdefault(client, session) != session:
            return True  # a client's session changed its process
    return len(first) == 2 and first[0] == first[1]  # two sessions on one process


async def transaction_pooler(dsn: str, *, timeout: float = CHECK_TIMEOUT) -> bool | None:
    """True when `dsn` leads through a transaction or statement pooler, False when each
    client gets a session of its own, None when it could not be told within `timeout` seconds
    (the database is down or slow: the processes wait for it as they always did)."""
    try:
        seen = await asyncio.wait_for(_sessions(dsn), timeout)
    except (psycopg.Error, OSError, TimeoutError) as exc:
        log.warning("could not check for a transaction pooler (%s); starting anyway",
                    " ".join(str(exc).split()) or type(exc).__name__)
        return None
    return pooled(seen)


async def refuse_pooler(process: str) -> str | None:
    """Why `process` must not start, as one line, or None: the way to the database its connections
    that need a session take (`valka.db.conninfo(direct=True)`) leads through a transaction pooler."""
    if not await transaction_pooler(conninfo(application_name=f"valka-pooler-check {process}", direct=True)):
        return None
    if valka_settings.DIRECT_DATABASE_URL:
        return (f"{process}: VALKA_DIRECT_DATABASE_URL leads through a transaction pooler: point it at "
                "PostgreSQL itself (LISTEN, the leader lock and the claims need sessions of their own)")
    return (f"{process}: DATABASE_URL leads through a transaction pooler: set VALKA_DIRECT_DATABASE_URL to a URL "
            "that reaches PostgreSQL itself (LISTEN, the leader lock and the claims need sessions of their own)")
