"""Writes a dispatcher must not drop on a passing failure (a deadlock, a lock wait cut short, the
database away for a moment): tried again with a growing pause. Past the last try, or once the
node is stopping (its pool closed), the scheduler's reaper and janitor recover what they would
have written, only later."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

log = logging.getLogger("valka.dispatcher")


async def write_retried(pool: AsyncConnectionPool, write: Callable[[Any], Awaitable[None]], *,
                        attempts: int, what: str) -> bool:
    """`write(conn)` on a connection of `pool`, up to `attempts` times; whether it got through."""
    for attempt in range(attempts):
        try:
            async with pool.connection() as conn:
                await write(conn)
            return True
        except Exception as exc:
            if pool.closed:
                return False
            log.warning("dispatcher: %s failed (%s); try %d of %d", what, exc, attempt + 1, attempts)
            await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
    return False
