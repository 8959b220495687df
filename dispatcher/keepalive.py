"""The keep-alive loop: `workers.last_heartbeat_at` of every worker this node serves, refreshed
every `interval`, so the scheduler's worker janitor only reaps workers whose dispatcher is gone.

It also sets them CONNECTED again if the janitor gave them up while this node could not write
(a database outage): their sessions are alive here. After a failed write it tries again every
second, so a database that comes back hears from every worker within about a second."""

from __future__ import annotations

import asyncio
import logging

from psycopg_pool import AsyncConnectionPool

from dispatcher import sql
from dispatcher.session import SessionRegistry

log = logging.getLogger("valka.dispatcher")


class Keepalive:
    def __init__(self, *, pool: AsyncConnectionPool, sessions: SessionRegistry, node_id: str,
                 interval: float) -> None:
        self.pool = pool
        self.sessions = sessions
        self.node_id = node_id
        self.interval = interval

    async def run_once(self) -> int:
        """Touch this node's CONNECTED workers; returns how many sessions it asked for."""
        sessions = [s for s in self.sessions if not s.closed]
        if sessions:
            async with self.pool.connection() as conn:
                await conn.execute(sql.TOUCH_WORKERS, {"worker_ids": [s.worker_id for s in sessions],
                                                       "session_ids": [s.session_id for s in sessions],
                                                       "node_id": self.node_id})
        return len(sessions)

    async def run(self, stop: asyncio.Event) -> None:
        wait = self.interval
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), wait)
                return
            except TimeoutError:
                pass
            try:
                await self.run_once()
                wait = self.interval
            except Exception as exc:
                log.warning("dispatcher: keepalive write failed: %s", exc)
                wait = min(self.interval, 1.0)
