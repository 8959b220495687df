"""The keep-alive loop: `workers.last_heartbeat_at` of every worker this node serves, refreshed
every `interval`, so the scheduler's worker janitor only reaps workers whose dispatcher is gone."""

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
        ids = self.sessions.worker_ids()
        if ids:
            async with self.pool.connection() as conn:
                await conn.execute(sql.TOUCH_WORKERS, {"worker_ids": ids, "node_id": self.node_id})
        return len(ids)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
                return
            except TimeoutError:
                pass
            try:
                await self.run_once()
            except Exception as exc:
                log.warning("dispatcher: keepalive write failed: %s", exc)
