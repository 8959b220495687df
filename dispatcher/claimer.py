"""The claim loop: hands due PENDING tasks to this node's workers with free slots.

Woken by NOTIFY (a task became claimable), by a freed slot, or by a new
worker; a slow poll backs every wake-up. One claim statement per queue per
pass, sized to the queue's free slots, spread round-robin over its workers.

Under load, results free slots one or two at a time; a claim for each would
cost a statement (and a walk of the claim index) per couple of tasks. So a
pass woken only by freed slots, while under a quarter of the queue's slots
are free, first lets results free more: until a quarter are free, for `gather`
at most, and it claims for all of them at once. The workers keep three
quarters of their slots busy meanwhile. Any other wake-up (a new task, a new
worker) ends the wait, and an idle worker's slots are all free: a new task is
claimed at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from dispatcher import protocol, sql
from dispatcher.session import InFlight, SessionRegistry, WorkerSession
from valka.ids import uuid7_text_many

log = logging.getLogger("valka.dispatcher")


@dataclass(frozen=True)
class ClaimerSettings:
    node_id: str  # written into tasks.claimed_by
    poll_interval: float  # seconds: a pass over every served queue at least this often
    max_batch: int = 500  # tasks per claim statement
    gather: float = 0.010  # seconds a pass for freed slots may wait for more (see the module's docstring)
    floor_ttl: float = 1.0  # seconds a claim floor lasts (see Floor)


async def claim(conn: AsyncConnection, *, queue: str, limit: int, node_id: str,
                after: tuple | None = None) -> list[tuple]:
    """Run CLAIM on a claim connection, as a prepared statement from the first claim on;
    `after` is where to start (see `Floor`)."""
    cur = await conn.execute(sql.CLAIM, sql.claim_params(queue=queue, limit=limit, node_id=node_id, after=after),
                             prepare=True)
    return await cur.fetchall()


@dataclass(frozen=True)
class Floor:
    """Where a queue's next claim starts within one priority: after the last task claimed there.

    Set while claims come back full (a backlog): the tasks before it were claimed, and their
    index entries, left behind until a vacuum, need not be walked again. A task that becomes
    due behind it (put back unsent, or scheduled in the past) is found by a claim from the
    start of the range: made at once when a claim after the floor does not fill its slots, and
    in any case `floor_ttl` after the floor was first set.
    """

    start: tuple[int, datetime, str]  # (priority, run_at, task id) of the last task claimed
    since: float


async def _first(*waits: Any) -> None:
    """Wait until the first of `waits` is done."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


class Claimer:
    """Claims on `pool` (connections set up with sql.CLAIM_SESSION) for the sessions in `sessions`;
    `unsend(task_ids)` puts back tasks claimed for sessions that closed before they got them."""

    def __init__(self, *, pool: AsyncConnectionPool, sessions: SessionRegistry, settings: ClaimerSettings,
                 unsend: Callable[[list[str]], None], room: asyncio.Event | None = None) -> None:
        self.pool = pool
        self.sessions = sessions
        self.settings = settings
        self.unsend = unsend
        # Set while the writer can take more (dispatcher.writer.Writer.room): a task claimed now
        # would add a start and, soon, a result to a full buffer.
        self.room = room
        self._wake = asyncio.Event()
        self._queues: set[str] = set()
        self._everything = True
        self._urgent = True  # a wake-up other than a freed slot is pending
        self._turn = itertools.count()
        self._floors: dict[str, Floor] = {}
        self._gathering = False

    def wake(self, queue: str | None = None) -> None:
        if queue is None:
            self._everything = True
        else:
            self._queues.add(queue)
        self._urgent = True
        self._wake.set()

    def freed(self, queue: str) -> None:
        """A slot of `queue` was freed (a result came back). While a gather waits for more, only
        the slot that makes a quarter free ends it: waking it for each result cost more than the
        claim it waits for."""
        self._queues.add(queue)
        if not (self._gathering and self._few_free((queue,))):
            self._wake.set()

    def _few_free(self, queues: Iterable[str]) -> bool:
        for queue in queues:
            sessions = self.sessions.for_queue(queue)
            if sum(s.free_slots() for s in sessions) * 4 >= sum(s.concurrency for s in sessions):
                return False
        return True

    async def _gather(self) -> None:
        """While the pending wake-ups are only freed slots and few are free, wait (`gather` at most)
        for results to free more; any other wake-up, or a quarter of the slots free, ends the wait."""
        if self._urgent or not self._few_free(self._queues):
            return
        self._gathering = True
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), self.settings.gather)
        except TimeoutError:
            pass
        finally:
            self._gathering = False

    async def run(self, stop: asyncio.Event) -> None:
        poll = self.settings.poll_interval
        backoff = 0.1
        while not stop.is_set():
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=poll)
            except TimeoutError:
                self._everything = self._urgent = True
            if stop.is_set():
                return
            if self.room is not None and not self.room.is_set():
                await _first(self.room.wait(), stop.wait())
                self._everything = self._urgent = True
                if stop.is_set():
                    return
            await self._gather()
            self._wake.clear()
            served = self.sessions.served_queues()
            queues = served if self._everything else self._queues & served
            self._everything, self._queues, self._urgent = False, set(), False
            try:
                for queue in sorted(queues):
                    await self.claim_queue(queue)
                backoff = 0.1
            except Exception:
                log.exception("dispatcher: claiming failed; retrying in %.1fs", backoff)
                self._queues |= queues
                self._urgent = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                self._wake.set()

    async def claim_queue(self, queue: str) -> int:
        sessions = [s for s in self.sessions.for_queue(queue) if s.free_slots() > 0]
        free = sum(s.free_slots() for s in sessions)
        if free <= 0:
            return 0
        limit = min(free, self.settings.max_batch)
        now = asyncio.get_running_loop().time()
        floor = self._floors.pop(queue, None)
        if floor is not None and now - floor.since > self.settings.floor_ttl:
            floor = None
        node_id = self.settings.node_id
        async with self.pool.connection() as conn:
            rows = await claim(conn, queue=queue, limit=limit, node_id=node_id, after=floor and floor.start)
            full = len(rows) == limit
            if floor is not None and not full:  # the backlog ahead is claimed: look behind the floor too
                rows += await claim(conn, queue=queue, limit=limit - len(rows), node_id=node_id)
        if full:
            last = rows[-1]
            self._floors[queue] = Floor((last[7], last[8], last[0]), floor.since if floor else now)
        if not rows:
            return 0
        self._distribute(queue, rows, sessions)
        if len(rows) == self.settings.max_batch:
            self.wake(queue)  # slots are still free and there may be more tasks where these came from
        return len(rows)

    def _distribute(self, queue: str, rows: list[tuple], sessions: list[WorkerSession]) -> None:
        start = next(self._turn)
        unsent: list[str] = []
        order = sessions[start % len(sessions):] + sessions[: start % len(sessions)]
        ring = itertools.cycle(order)
        run_ids = iter(uuid7_text_many(len(rows)))
        for task_id, task_name, _q, payload, metadata, attempt, timeout, _prio, _run_at in rows:
            session = None
            for _ in range(len(order)):
                candidate = next(ring)
                if candidate.free_slots() > 0:
                    session = candidate
                    break
            if session is None:  # every session closed meanwhile
                unsent.append(task_id)
                continue
            entry = InFlight(task_id=task_id, run_id=next(run_ids), queue=queue, attempt=attempt)
            session.reserve(entry)
            session.send(protocol.assignment(entry, task_name=task_name, payload=payload, metadata=metadata,
                                             timeout_seconds=timeout), entry)
        if unsent:
            self.unsend(unsent)
