"""Delivering signals over the worker streams this node holds.

A signal is delivered right after its task's assignment (PENDING signals of
the tasks just started, oldest first) and, for a task already running here,
as soon as the API's NOTIFY arrives. Acknowledgements come back on the
stream. Only this node's sessions are looked at: the node that holds a task
is the only one that can deliver to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from dispatcher.flusher import valid_uuid
from dispatcher.session import WorkerSession
from signals import sql
from valka.v1 import worker_pb2 as pb

if TYPE_CHECKING:
    from dispatcher.node import DispatcherNode

log = logging.getLogger("valka.dispatcher")


class SignalRelay:
    def __init__(self, node: DispatcherNode) -> None:
        self.node = node
        self._background: set[asyncio.Task] = set()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- hooks called by the node --
    def on_notify(self, task_id: str) -> None:
        for session in self.node.sessions.values():
            entry = session.in_flight.get(task_id)
            if entry is None:
                continue
            if entry.started.done():
                if entry.started.result():
                    self._spawn(self.deliver([task_id]))
            else:
                # The start is being written: the signal may have missed that pass's look for
                # waiting signals, so look again once it has committed.
                entry.started.add_done_callback(
                    lambda f: f.result() and self._spawn(self.deliver([task_id])))
            return
        # Not running here (yet): the post-start delivery or another node takes it.

    def on_ack(self, session: WorkerSession, signal_id: str) -> None:
        if valid_uuid(signal_id):
            self._spawn(self._ack(session.worker_id, signal_id))

    async def deliver(self, task_ids: list[str]) -> int:
        """Mark the PENDING signals of `task_ids` DELIVERED and send them to the workers holding them."""
        async with self.node.pool.connection() as own:
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
            session = self._holder(str(task_id))
            if session is None:
                undeliverable.append(task_id)
                continue
            session.send(pb.WorkerResponse(task_signal=pb.TaskSignal(
                signal_id=str(signal_id), task_id=str(task_id), signal_name=signal_type, payload=payload or "",
                timestamp_ms=int(created_at.timestamp() * 1000) if created_at else int(time.time() * 1000),
            )))
        if undeliverable:
            # The task left this node between the claim and now: let the next attempt have them.
            async with self.node.pool.connection() as own:
                await own.execute(sql.REDELIVER, {"task_ids": undeliverable})
        return len(rows) - len(undeliverable)

    def _holder(self, task_id: str) -> WorkerSession | None:
        for session in self.node.sessions.values():
            if task_id in session.in_flight and not session.closed:
                return session
        return None

    async def _ack(self, worker_id: str, signal_id: str) -> None:
        try:
            async with self.node.pool.connection() as conn:
                await conn.execute(sql.ACKNOWLEDGE, {"ids": [signal_id], "worker_id": worker_id})
        except Exception as exc:
            log.warning("dispatcher: recording the acknowledgement of signal %s failed: %s", signal_id, exc)
