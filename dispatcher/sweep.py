"""The sweep: a look, every `interval` and whenever the LISTEN connection comes back, at the runs
this node's workers hold.

NOTIFY only wakes things up; a notification sent while the LISTEN connection was down is lost.
So the sweep re-reads what the notifications would have said, from the rows: a run someone else
closed (a cancel, the lease reaper, the worker janitor) is stopped on its worker, and the
PENDING signals of running tasks are delivered. A delivery that failed is retried here too.
"""

from __future__ import annotations

import asyncio
import logging

from psycopg_pool import AsyncConnectionPool

from dispatcher import sql
from dispatcher.relay import Relay
from dispatcher.session import SessionRegistry

log = logging.getLogger("valka.dispatcher")


class Sweep:
    def __init__(self, *, pool: AsyncConnectionPool, sessions: SessionRegistry, relay: Relay,
                 interval: float) -> None:
        self.pool = pool
        self.sessions = sessions
        self.relay = relay
        self.interval = interval
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run_once(self) -> tuple[int, int]:
        """Stop the closed runs and deliver the waiting signals; returns how many of each it found."""
        held = [(entry.task_id, entry.run_id) for session in self.sessions for entry in session.in_flight.values()
                if entry.started.done() and entry.started.result()]
        if not held:
            return 0, 0
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.SWEEP, {"task_ids": [t for t, _ in held], "run_ids": [r for _, r in held]})
            rows = await cur.fetchall()
        closed = [(task_id, status, error) for task_id, status, error, _ in rows if status != "RUNNING"]
        for task_id, status, error in closed:
            self.relay.cancel(task_id, _why(status, error))
        waiting = [task_id for task_id, status, _, has_signals in rows if has_signals and status == "RUNNING"]
        if waiting:
            await self.relay.deliver(waiting)
        return len(closed), len(waiting)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except TimeoutError:
                pass
            self._wake.clear()
            if stop.is_set():
                return
            try:
                await self.run_once()
            except Exception as exc:
                log.warning("dispatcher: the sweep failed (%s); again in %.1fs", exc, self.interval)


def _why(status: str | None, error: str | None) -> str:
    """What the worker is told when its run was closed behind its back."""
    if status == "CANCELLED":
        return "task cancelled"
    if status is None:
        return "the run no longer exists"
    return f"the run was closed {status}" + (f" ({error})" if error else "")
