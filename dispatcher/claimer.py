"""The claim loop: hands due PENDING tasks to this node's workers with free slots.

Woken by NOTIFY (a task became claimable), by a freed slot, or by a new
worker; a slow poll backs every wake-up. One claim statement per queue per
pass, sized to the queue's free slots, spread round-robin over its workers.

Under load, results free slots one or two at a time; a claim for each would
cost a statement (and a walk of the claim index) per couple of tasks. So a
pass woken only by freed slots, while under a quarter of the queue's slots
are free, first lets results free more: until a quarter are free, for `gather`
at most, and it claims for all of them at once. The workers keep three
quarters of their slots busy meanwhile. A queue with controls waits until half
are free: its claim costs more, and most of that cost is the same whatever the
claim's size (it counts the queue's running tasks, or visits each of its keys).
Any other wake-up (a new task, a new worker) ends the wait, and an idle
worker's slots are all free: a new task is claimed at once.

A queue with controls (docs/queues.md; what this node knows of them is `controls`) is claimed
with CLAIM_LIMITED, one claim of it at a time across the cluster, or not at all while paused.
Its claim says when to look again: its rate window's next opening (a timer here), or, while a
running limit holds it back, the NOTIFY valka_queue_slot_freed that a task's written end sends (a
result here frees no slot of such a queue before then). A rate-limited queue is claimed again once the
tasks of its last claim have started, which keeps the window's stamps close to the starts. A rate
limit that claims not yet started fill (another node's, whose starts this node does not see) gives
no opening to wait for: the queue is claimed again after `unstarted_retry`, by when they have
usually started and count in the window as stamps, which say when it opens; the wait doubles each
time it finds them still unstarted (a claim held until the reaper puts it back), up to the poll.
The claims a limit held back are counted, and written at most once a second.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from dispatcher import protocol, sql
from dispatcher.controls import LIMITED, OPEN, PAUSED, QueueControls
from dispatcher.hops import HopLog
from dispatcher.offers import OFFER_MAX, Offers
from dispatcher.session import InFlight, SessionRegistry, WorkerSession
from valka.db import next_retry_wait
from valka.ids import uuid7_text_many
from valka_sdk import tracing

log = logging.getLogger("valka.dispatcher")

RUNNING_LIMITS = ("max_running", "max_running_per_key")  # the limits a task's end makes room in


@dataclass(frozen=True)
class ClaimerSettings:
    node_id: str  # written into tasks.claimed_by
    poll_interval: float  # seconds: a pass over every served queue at least this often
    max_batch: int = 500  # tasks per claim statement
    gather: float = 0.010  # seconds a pass for freed slots may wait for more (see the module's docstring)
    floor_ttl: float = 1.0  # seconds a claim floor lasts (see Floor)
    limited_every: float = 1.0  # seconds between writes of the claims a limit held back
    unstarted_retry: float = 0.05  # seconds before a rate-limited claim that unstarted claims held back looks again


async def claim(conn: AsyncConnection, *, queue: str, limit: int, node_id: str,
                after: tuple | None = None) -> list[tuple] | None:
    """Run CLAIM on a claim connection, as a prepared statement from the first claim on;
    `after` is where to start (see `Floor`). None: the queue has controls, CLAIM_LIMITED's."""
    cur = await conn.execute(sql.CLAIM, sql.claim_params(queue=queue, limit=limit, node_id=node_id, after=after),
                             prepare=True)
    rows = await cur.fetchall()
    return None if rows and rows[0][0] is None else rows


async def claim_ids(conn: AsyncConnection, *, queue: str, ids: list[str], node_id: str) -> list[tuple] | None:
    """Run CLAIM_IDS: those of `ids` still due and PENDING in `queue` (see `Claimer.ready`). None: the
    queue has controls, CLAIM_LIMITED's."""
    cur = await conn.execute(sql.CLAIM_IDS, {"queue": queue, "ids": ids, "node_id": node_id}, prepare=True)
    rows = await cur.fetchall()
    return None if rows and rows[0][0] is None else rows


@dataclass(frozen=True)
class Limited:
    """What CLAIM_LIMITED answered besides the tasks."""

    state: str  # limited; open (no controls any more), paused, missing (no row): read the controls again
    held: str | None  # the limit that held the claim back, if one did
    retry_in: float | None  # seconds until the rate window lets a task start, while it lets none
    again: bool  # keys had more than their share: claim again


async def claim_limited(conn: AsyncConnection, *, queue: str, limit: int, node_id: str) -> tuple[list[tuple], Limited]:
    """LOCK_QUEUE then CLAIM_LIMITED, in one transaction (prepared, as `claim`), sent together with
    its BEGIN and COMMIT: one round trip, not four."""
    params = {"queue": queue, "limit": limit, "node_id": node_id}
    async with conn.pipeline(), conn.transaction():
        await conn.execute(sql.LOCK_QUEUE, params, prepare=True)
        cur = await conn.execute(sql.CLAIM_LIMITED, params, prepare=True)
    *tasks, answer = await cur.fetchall()
    return [row[:9] for row in tasks], Limited(*answer[9:13])


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
                 unsend: Callable[[list[str]], None], room: asyncio.Event | None = None,
                 controls: QueueControls | None = None, hops: HopLog | None = None,
                 offers: Offers | None = None) -> None:
        self.pool = pool
        self.offers = offers  # idle slots offered to producers (dispatcher.offers); None: none
        self.hops = hops  # per-task timestamps for the benchmark, when asked for (dispatcher.hops)
        self.sessions = sessions
        self.settings = settings
        self.unsend = unsend
        self.controls = controls or QueueControls(max_age=settings.poll_interval)
        # Set while the writer can take more (dispatcher.writer.Writer.room): a task claimed now
        # would add a start and, soon, a result to a full buffer.
        self.room = room
        self._wake = asyncio.Event()
        self._queues: set[str] = set()
        # Tasks named by their insert's NOTIFY, by queue, and the queues whose last full claim came
        # back short: nothing else of theirs was due then (see `ready`).
        self._ids: dict[str, list[str]] = {}
        self._drained: set[str] = set()
        self._everything = True
        self._urgent = True  # a wake-up other than a freed slot is pending
        self._turn = itertools.count()
        self._floors: dict[str, Floor] = {}
        self._gathering = False
        self._retry_at: dict[str, float] = {}  # when a rate-limited queue's window opens again
        self._unstarted_wait: dict[str, float] = {}  # the next wait for a window unstarted claims fill
        self._limited: Counter[tuple[str, str]] = Counter()  # (queue, limit): claims held back, not yet written
        self._limited_at = 0.0
        self._waiters: set[asyncio.Task] = set()
        self._held_by_running: set[str] = set()  # queues whose last claim max_running(_per_key) held back
        self.stopped = False  # set by the node as claims stop: a task handed over then is put back

    def wake(self, queue: str | None = None) -> None:
        if queue is None:
            self._everything = True
        else:
            self._queues.add(queue)
        self._urgent = True
        self._wake.set()

    def ready(self, payload: str) -> None:
        """NOTIFY valka_task_ready: a queue has claimable tasks (`queue`), or one task was inserted
        on its own (`queue task_id`, tasks/sql/producer.py INSERT_TASK).

        A named task is claimed by its id (CLAIM_IDS, one probe) when that takes what a full claim
        would: the queue's last full claim came back short, so nothing else of it was due, and there
        is a free slot for each task named. Otherwise the queue gets a full claim. Every other
        wake-up (a retry, a due task, a task put back, a freed slot, the poll) is a full claim too,
        which finds what was not named.

        Every dispatcher of the database hears every queue's tasks. One of a queue that no open
        session here takes stops at once, without waking the claim loop: the session that opens
        for it claims its tasks then (SessionHandler.open_session wakes its queues). Waking the
        loop for each such task took about 0.1 ms of CPU, on the cores the producers share."""
        queue, space, task_id = payload.rpartition(" ")
        named = bool(space) and len(task_id) == 36  # else a queue alone (a task id is 36 characters)
        if not named:
            queue = payload
        if not self.sessions.for_queue(queue):  # no open session takes it, busy or not
            return
        if not named:
            self.wake(queue)
            return
        self._ids.setdefault(queue, []).append(task_id)
        if self.hops is not None:
            self.hops.notified(task_id)
        self._urgent = True
        self._wake.set()

    def handed(self, payload: str) -> None:
        """NOTIFY on this node's handoff channel: a producer handed it a task in its INSERT
        (DISPATCHING, claimed by this node; tasks/sql/producer.py INSERT_TASK), as the JSON array a
        claim answers, or `[id, queue]` when that did not fit (read from the row then). It is sent
        at once, as a claimed task, unless this node cannot take it now (stopping, no free slot,
        the queue's controls changed or unknown): then it is put back, PENDING, and claimed as
        any other."""
        began = time.time_ns()
        row = json.loads(payload)
        task_id, queue = row[0], row[2] if len(row) > 2 else row[1]
        if self.offers is not None:
            self.offers.took(queue)
        if self.hops is not None:
            self.hops.notified(task_id)
        sessions = [s for s in self.sessions.for_queue(queue) if s.free_slots() > 0]
        if (self.stopped or not sessions or self.controls.forgotten()
                or self.controls.mode(queue) != OPEN):
            self.unsend([task_id])
        elif len(row) == 2:
            waiter = asyncio.get_running_loop().create_task(self._fetch_handed(task_id, queue, began))
            self._waiters.add(waiter)
            waiter.add_done_callback(self._waiters.discard)
        else:
            self._hand_out(queue, [tuple(row)], sessions, began)

    async def _fetch_handed(self, task_id: str, queue: str, began: int) -> None:
        try:
            async with self.pool.connection() as conn:
                cur = await conn.execute(sql.HANDED_TASK, {"task_id": task_id, "node_id": self.settings.node_id})
                rows = await cur.fetchall()
        except Exception as exc:  # the sweep puts it back (sql.HANDED_UNHEARD)
            log.warning("dispatcher: could not read the task %s handed over (%s)", task_id, exc)
            return
        sessions = [s for s in self.sessions.for_queue(queue) if s.free_slots() > 0]
        if rows and (self.stopped or not sessions):
            self.unsend([task_id])
        elif rows:  # none: cancelled meanwhile
            self._hand_out(queue, rows, sessions, began)

    def _offerable(self) -> dict[str, int]:
        """The slots to offer producers, by queue (dispatcher.offers): a queue without controls whose
        last full claim came back short (nothing else of it was due) gets its free slots, up to
        OFFER_MAX; any other none, so that a backlog is claimed in order and limits by the claim."""
        if self.controls.forgotten():
            return {}
        wanted = {}
        for queue in self.sessions.served_queues():
            if queue in self._drained and self.controls.mode(queue) == OPEN:
                free = sum(s.free_slots() for s in self.sessions.for_queue(queue))
                if free > 0:
                    wanted[queue] = min(free, OFFER_MAX)
        return wanted

    def queue_changed(self, queue: str) -> None:
        """A queue's controls changed (NOTIFY valka_queue_changed): read them again, and claim."""
        self.controls.forget()
        self.wake(queue)

    def freed(self, queue: str) -> None:
        """A slot of `queue` was freed (a result came back). While a running limit holds the queue's
        claims back, its task counts until the result is written: `slot_freed` comes then, by NOTIFY
        (a claim now would find no room)."""
        if queue not in self._held_by_running:
            self.slot_freed(queue)

    def slot_freed(self, queue: str) -> None:
        """A slot of `queue` is free. While a gather waits for more, only the slot that makes enough
        free ends it: waking it for each result cost more than the claim it waits for."""
        self._queues.add(queue)
        if not (self._gathering and self._few_free((queue,))):
            self._wake.set()

    def _few_free(self, queues: Iterable[str]) -> bool:
        """Whether each of `queues` has fewer slots free than its claim waits for (see the module's
        docstring): a quarter of its slots, half for a queue with controls."""
        for queue in queues:
            sessions = self.sessions.for_queue(queue)
            share = 2 if self.controls.mode(queue) == LIMITED else 4
            if sum(s.free_slots() for s in sessions) * share >= sum(s.concurrency for s in sessions):
                return False
        return True

    async def _gather(self) -> None:
        """While the pending wake-ups are only freed slots and few are free, wait (`gather` at most)
        for results to free more; any other wake-up, or enough slots free, ends the wait."""
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

    def _next_timer(self) -> float | None:
        """When the next rate window opens or pause ends, on the loop's clock."""
        times = [*self._retry_at.values(), self.controls.next_resume() or float("inf")]
        first = min(times)
        return None if first == float("inf") else first

    def _fire_timers(self) -> None:
        now = asyncio.get_running_loop().time()
        due = [q for q, at in self._retry_at.items() if at <= now]
        for queue in due:
            del self._retry_at[queue]
        for queue in due + self.controls.resume_due():
            self.wake(queue)

    async def run(self, stop: asyncio.Event) -> None:
        poll = self.settings.poll_interval
        backoff = 0.1
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            timer = self._next_timer()
            try:
                await asyncio.wait_for(self._wake.wait(),
                                       timeout=poll if timer is None else min(poll, max(timer - loop.time(), 0.0)))
            except TimeoutError:
                if timer is None or timer - loop.time() > 0.001:
                    self._everything = self._urgent = True
            self._fire_timers()
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
            named = {q: ids for q, ids in self._ids.items() if q in served and q not in queues}
            self._everything, self._queues, self._ids, self._urgent = False, set(), {}, False
            try:
                if self.controls.forgotten():
                    await self._read_controls()
                for queue in sorted(queues | named.keys()):
                    await self.claim_queue(queue, named.get(queue))
                if self.controls.stale():  # old only: read after the claims, off a new task's way to
                    await self._read_controls()  # its worker (the claims check the rows themselves)
                await self._write_limited()
                if self.offers is not None and not stop.is_set():
                    await self.offers.update(self._offerable())
                backoff = 0.1
            except Exception:
                log.exception("dispatcher: claiming failed; retrying in %.1fs", backoff)
                self._queues |= queues | named.keys()
                self._urgent = True
                await asyncio.sleep(backoff)
                backoff = next_retry_wait(backoff)
                self._wake.set()

    async def _read_controls(self) -> None:
        async with self.pool.connection() as conn:
            await self.controls.read(conn)

    async def claim_queue(self, queue: str, ids: list[str] | None = None) -> int:
        """Claim for the free slots of `queue`'s sessions: the tasks `ids` names, when `ready` allows
        that, else the queue's due tasks in claim order."""
        sessions = [s for s in self.sessions.for_queue(queue) if s.free_slots() > 0]
        free = sum(s.free_slots() for s in sessions)
        mode = self.controls.mode(queue)
        if ids is not None and (queue not in self._drained or len(ids) > min(free, self.settings.max_batch)
                                or mode != OPEN):
            ids = None  # a full claim, now or at the next freed slot, takes them in order
        if ids is None:
            self._drained.discard(queue)  # until a full claim comes back short again
        if free <= 0 or mode == PAUSED:
            return 0
        limit = min(free, self.settings.max_batch)
        if mode == LIMITED:
            return await self._claim_limited(queue, limit, sessions)
        if ids is not None:
            return await self._claim_ids(queue, ids, sessions)
        now = asyncio.get_running_loop().time()
        floor = self._floors.pop(queue, None)
        if floor is not None and now - floor.since > self.settings.floor_ttl:
            floor = None
        node_id = self.settings.node_id
        began = time.time_ns()  # the claim span's start, should it claim anything
        async with self.pool.connection() as conn:
            rows = await claim(conn, queue=queue, limit=limit, node_id=node_id, after=floor and floor.start)
            if rows is None:  # the queue has controls since they were read
                self.queue_changed(queue)
                return 0
            full = len(rows) == limit
            if floor is not None and not full:  # the backlog ahead is claimed: look behind the floor too
                rows += await claim(conn, queue=queue, limit=limit - len(rows), node_id=node_id) or []
        if len(rows) < limit:
            self._drained.add(queue)  # nothing more of it was due: its next new tasks may be claimed by id
        if full:
            last = rows[-1]
            self._floors[queue] = Floor((last[7], last[8], last[0]), floor.since if floor else now)
        if not rows:
            return 0
        self._hand_out(queue, rows, sessions, began)
        if len(rows) == self.settings.max_batch:
            self.wake(queue)  # slots are still free and there may be more tasks where these came from
        return len(rows)

    async def _claim_ids(self, queue: str, ids: list[str], sessions: list[WorkerSession]) -> int:
        began = time.time_ns()
        async with self.pool.connection() as conn:
            rows = await claim_ids(conn, queue=queue, ids=ids, node_id=self.settings.node_id)
        if rows is None:  # the queue has controls since they were read
            self._drained.discard(queue)
            self.queue_changed(queue)
            return 0
        if rows:
            self._hand_out(queue, rows, sessions, began)
        return len(rows)

    async def _claim_limited(self, queue: str, limit: int, sessions: list[WorkerSession]) -> int:
        began = time.time_ns()
        async with self.pool.connection() as conn:
            rows, answer = await claim_limited(conn, queue=queue, limit=limit, node_id=self.settings.node_id)
        if answer.state != LIMITED:
            self.queue_changed(queue)
        if answer.held is not None:
            self._limited[(queue, answer.held)] += 1
        if answer.held in RUNNING_LIMITS:
            self._held_by_running.add(queue)
        else:
            self._held_by_running.discard(queue)
        now = asyncio.get_running_loop().time()
        if answer.held == "rate_limit" and answer.retry_in is None:  # unstarted claims: no opening to wait for
            wait = self._unstarted_wait.get(queue, self.settings.unstarted_retry)
            self._retry_at[queue] = now + wait
            self._unstarted_wait[queue] = min(wait * 2, self.settings.poll_interval)
        else:
            self._unstarted_wait.pop(queue, None)
            if answer.retry_in is not None:
                self._retry_at[queue] = now + answer.retry_in
        if not rows:
            return 0
        entries = self._hand_out(queue, rows, sessions, began)
        if self.controls.rated(queue) and entries:
            self._wake_when_started(queue, entries)
        if answer.again or len(rows) == self.settings.max_batch:
            self.wake(queue)
        return len(rows)

    def _wake_when_started(self, queue: str, entries: list[InFlight]) -> None:
        """Claim `queue` again once `entries` have started (or 5 s on): that claim stamps their
        starts in the rate window (dispatcher/sql.py CLAIM_LIMITED)."""
        async def wait() -> None:
            await asyncio.wait([e.started for e in entries], timeout=5.0)
            self.wake(queue)

        waiter = asyncio.get_running_loop().create_task(wait())
        self._waiters.add(waiter)
        waiter.add_done_callback(self._waiters.discard)

    async def _write_limited(self) -> None:
        """The claims a limit held back since the last write, at most once per `limited_every`."""
        now = asyncio.get_running_loop().time()
        if not self._limited or now - self._limited_at < self.settings.limited_every:
            return
        counts, self._limited = self._limited, Counter()
        self._limited_at = now
        try:
            async with self.pool.connection() as conn:
                await conn.execute(sql.RECORD_LIMITED, {"queues": [q for q, _ in counts],
                                                        "reasons": [r for _, r in counts],
                                                        "counts": list(counts.values())})
        except BaseException:
            self._limited.update(counts)
            raise

    def _hand_out(self, queue: str, rows: list[tuple], sessions: list[WorkerSession], began: int) -> list[InFlight]:
        """`_distribute`, inside the claim's span when a tracer provider is set (`claim_span`)."""
        tracer = tracing.tracer()
        if tracer is None:
            return self._distribute(queue, rows, sessions, began)
        with claim_span(tracer, queue, rows, began):
            return self._distribute(queue, rows, sessions, began)

    def _distribute(self, queue: str, rows: list[tuple], sessions: list[WorkerSession],
                    began: int) -> list[InFlight]:
        """Spread the claimed `rows` (of a claim that began at `began`, time.time_ns()) over the
        sessions with free slots; those none can take are unsent."""
        if self.hops is not None:
            self.hops.claimed((row[0] for row in rows), began / 1e9)
        start = next(self._turn)
        unsent: list[str] = []
        order = sessions[start % len(sessions):] + sessions[: start % len(sessions)]
        ring = itertools.cycle(order)
        run_ids = iter(uuid7_text_many(len(rows)))
        entries = []
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
            entries.append(entry)
        if unsent:
            self.unsend(unsent)
        return entries


def claim_span(tracer: trace.Tracer, queue: str, rows: list[tuple], began: int) -> AbstractContextManager[Any]:
    """`valka.claim <queue>`, from `began` (the claim's start) to the end of its distribution: a
    trace of its own, linked to the trace of each task claimed that carries one (not their parent:
    a claim serves many traces). Claims that found nothing make no span."""
    links = [trace.Link(context, {"messaging.message.id": row[0]}) for row in rows
             if (context := tracing.link_of(row[4])) is not None]
    return tracer.start_as_current_span(
        f"valka.claim {queue}", context=Context(), kind=trace.SpanKind.INTERNAL, links=links, start_time=began,
        attributes=tracing.messaging(queue, **{"messaging.operation.type": "receive",
                                              "messaging.operation.name": "claim",
                                              "messaging.batch.message_count": len(rows)}))
