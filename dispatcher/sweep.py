"""The sweep: a look, every `interval` and whenever the LISTEN connection comes back (and once
more a little later), at the runs this node's workers hold.

NOTIFY only wakes things up; a notification sent while the LISTEN connection was down is lost.
So the sweep re-reads what the notifications would have said, from the rows: a run someone else
closed (a cancel, the lease reaper, the worker janitor) is stopped on its worker, the PENDING
signals of running tasks are delivered, and a task a producer handed to this node whose NOTIFY
was lost is put back, to be claimed. A delivery that failed is retried here too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from psycopg_pool import AsyncConnectionPool

from dispatcher import sql
from dispatcher.relay import Relay
from dispatcher.session import SessionRegistry

log = logging.getLogger("valka.dispatcher")


# Seconds a task handed to this node may wait for its NOTIFY to be read before the sweep puts it
# back: far more than reading one takes, far less than the reaper's wait for a dead node's.
HANDED_GRACE = 2.0
# How long after HANDED_GRACE the look that follows a reconnect comes (`Sweep.reconnected`).
RELOOK_MARGIN = 0.25


class Sweep:
    def __init__(self, *, pool: AsyncConnectionPool, sessions: SessionRegistry, relay: Relay,
                 interval: float, unsend: Callable[[list[str]], None] | None = None, node_id: str = "",
                 offered: Callable[[], set[str]] = set, starting: Callable[[], set[str]] = set) -> None:
        self.pool = pool
        self.sessions = sessions
        self.relay = relay
        self.interval = interval
        self.unsend = unsend
        self.node_id = node_id
        self.offered = offered  # the queues this node ever offered slots of (dispatcher.offers)
        self.starting = starting  # tasks sent whose start the writer has not settled (Writer.starting)
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    def reconnected(self) -> None:
        """The LISTEN connection is back: look now, and again once a task handed over just before it
        came back (its NOTIFY lost) is HANDED_GRACE old. A producer hands tasks to this node's offers
        while PostgreSQL is back and the connection not yet; waiting for the next `interval` to put
        those back held them seconds after a restart."""
        self.wake()
        asyncio.get_running_loop().call_later(HANDED_GRACE + RELOOK_MARGIN, self.wake)

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

    async def put_back_unheard(self) -> int:
        """Put back (PENDING) the tasks producers handed to this node whose NOTIFY it never read
        (the LISTEN connection was down then): DISPATCHING for it a while, held by none of its
        sessions, and not sent with a start still on its way (a slow writer's, whose result came
        back first: putting those back raced the start and ran them twice). Returns how many."""
        queues = sorted(self.offered())
        if self.unsend is None or not queues:
            return 0
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.HANDED_UNHEARD, {"queues": queues, "node_id": self.node_id,
                                                          "after": HANDED_GRACE})
            found = [task_id for (task_id,) in await cur.fetchall()]
        held = {entry.task_id for session in self.sessions for entry in session.in_flight.values()}
        held |= self.starting()
        unheard = [task_id for task_id in found if task_id not in held]
        if unheard:
            log.info("dispatcher: %d task(s) handed over unheard; put back", len(unheard))
            self.unsend(unheard)
        return len(unheard)

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
                await self.put_back_unheard()
            except Exception as exc:
                log.warning("dispatcher: the sweep failed (%s); again in %.1fs", exc, self.interval)


def _why(status: str | None, error: str | None) -> str:
    """What the worker is told when its run was closed behind its back."""
    if status == "CANCELLED":
        return "task cancelled"
    if status is None:
        return "the run no longer exists"
    return f"the run was closed {status}" + (f" ({error})" if error else "")
