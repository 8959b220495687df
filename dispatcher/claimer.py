"""The claim loop: hands due PENDING tasks to this node's workers with free slots.

Woken by NOTIFY (a task became claimable), by a freed slot, or by a new
worker; a slow poll backs every wake-up. One claim statement per queue per
pass, sized to the queue's free slots, spread round-robin over its workers.

Under load, results free slots one or two at a time; a claim for each would
cost a statement (and a walk of the claim index) per couple of tasks. So a
pass woken only by freed slots, while under a quarter of the queue's slots
are free, first lets results free more: until a quarter are free, for GATHER
at most, and it claims for all of them at once. The workers keep three
quarters of their slots busy meanwhile. Any other wake-up (a new task, a new
worker) ends the wait, and an idle worker's slots are all free: a new task is
claimed at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from dispatcher import sql
from dispatcher.session import InFlight, WorkerSession
from valka.ids import uuid7_text_many
from valka.v1 import worker_pb2 as pb

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from dispatcher.node import DispatcherNode

log = logging.getLogger("valka.dispatcher")

MAX_BATCH = 500
GATHER = 0.010  # seconds
FLOOR_TTL = 1.0  # seconds


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
    in any case FLOOR_TTL after the floor was first set.
    """

    start: tuple[int, datetime, str]  # (priority, run_at, task id) of the last task claimed
    since: float


class Claimer:
    def __init__(self, node: DispatcherNode) -> None:
        self.node = node
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
            sessions = self.node.sessions_for(queue)
            if sum(s.free_slots() for s in sessions) * 4 >= sum(s.concurrency for s in sessions):
                return False
        return True

    async def _gather(self) -> None:
        """While the pending wake-ups are only freed slots and few are free, wait (GATHER at most)
        for results to free more; any other wake-up, or a quarter of the slots free, ends the wait."""
        if self._urgent or not self._few_free(self._queues):
            return
        self._gathering = True
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), GATHER)
        except TimeoutError:
            pass
        finally:
            self._gathering = False

    async def run(self, stop: asyncio.Event) -> None:
        poll = self.node.settings.poll_interval
        backoff = 0.1
        while not stop.is_set():
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=poll)
            except TimeoutError:
                self._everything = self._urgent = True
            if stop.is_set() or self.node.stopping:
                return
            await self._gather()
            self._wake.clear()
            queues = self.node.served_queues() if self._everything else self._queues & self.node.served_queues()
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
        sessions = [s for s in self.node.sessions_for(queue) if s.free_slots() > 0]
        free = sum(s.free_slots() for s in sessions)
        if free <= 0:
            return 0
        limit = min(free, MAX_BATCH)
        now = asyncio.get_running_loop().time()
        floor = self._floors.pop(queue, None)
        if floor is not None and now - floor.since > FLOOR_TTL:
            floor = None
        node_id = self.node.settings.node_id
        async with self.node.claim_pool.connection() as conn:
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
        if len(rows) == MAX_BATCH:
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
            session.send(pb.WorkerResponse(task_assignment=pb.TaskAssignment(
                task_id=entry.task_id, task_run_id=entry.run_id, queue_name=queue, task_name=task_name,
                input=payload or "", attempt_number=attempt, timeout_seconds=timeout, metadata=metadata or "{}",
            )), entry)
        if unsent:
            self.node.unsend(unsent)
