"""The relay: what the cluster tells a running task, sent over the worker stream that holds it.

Signals are delivered right after their task's start is written (the PENDING signals of the
tasks just started, oldest first) and, for a task already running here, as soon as the API's
NOTIFY arrives (acknowledgements come back on the stream, written by the writer). Cancellations go to the worker as
soon as the cancel's NOTIFY arrives, or when a start finds its task cancelled. Only this
node's sessions are looked at: the node that holds a task is the only one that can reach it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from psycopg_pool import AsyncConnectionPool

from dispatcher import protocol
from dispatcher.session import SessionRegistry
from signals import sql

log = logging.getLogger("valka.dispatcher")


class Relay:
    def __init__(self, *, pool: AsyncConnectionPool, sessions: SessionRegistry) -> None:
        self.pool = pool
        self.sessions = sessions
        self._background: set[asyncio.Task] = set()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- cancellations --
    def cancel(self, task_id: str, reason: str) -> None:
        """Tell the worker holding `task_id` to stop it (once)."""
        for session in self.sessions:
            entry = session.in_flight.get(task_id)
            if entry is not None and not entry.cancel_sent:
                entry.cancel_sent = True
                session.send(protocol.cancellation(task_id, reason))

    # -- signals --
    def on_signal(self, task_id: str) -> None:
        """A signal was stored for `task_id` (its NOTIFY)."""
        entry = self.sessions.in_flight(task_id)
        if entry is None:
            return  # not running here (yet): the post-start delivery or another node takes it
        if entry.started.done():
            if entry.started.result():
                self._spawn(self.deliver([task_id]))
        else:
            # The start is being written: the signal may have missed that pass's look for
            # waiting signals, so look again once it has committed.
            entry.started.add_done_callback(lambda f: f.result() and self._spawn(self.deliver([task_id])))

    async def deliver(self, task_ids: list[str]) -> int:
        """Mark the PENDING signals of `task_ids` DELIVERED and send them to the workers holding them."""
        async with self.pool.connection() as own:
            rows = await self.take(own, task_ids)
        return await self.send_taken(rows)

    async def take(self, conn: Any, task_ids: list[str]) -> list[tuple]:
        """Mark the PENDING signals of `task_ids` DELIVERED in the caller's transaction; send them
        with `send_taken` only after it commits, so an acknowledgement never overtakes the commit."""
        rows = await (await conn.execute(sql.TAKE_PENDING, {"task_ids": task_ids})).fetchall()
        rows.sort(key=lambda r: r[0])  # uuid7: creation order
        return rows

    async def send_taken(self, rows: list[tuple]) -> int:
        undeliverable = []
        for signal_id, task_id, signal_type, payload, created_at in rows:
            session = self.sessions.holder(str(task_id))
            if session is None:
                undeliverable.append(task_id)
                continue
            session.send(protocol.signal(signal_id, task_id, signal_type, payload, created_at))
        if undeliverable:
            # The task left this node between the claim and now: let the next attempt have them.
            async with self.pool.connection() as own:
                await own.execute(sql.REDELIVER, {"task_ids": undeliverable})
        return len(rows) - len(undeliverable)
