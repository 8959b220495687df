"""The dispatcher's single writer: buffers what workers report and writes it in batches.

The buffer is bounded (`buffer_bytes`, counted from the outputs, errors and log lines it
holds): once full, `room` is cleared until a pass has written half of it, and the node's
claimer and stream readers wait for it. Workers are held back by gRPC's flow control, and
nothing is dropped, while the database is slow or away.

Starts (DISPATCHING → RUNNING), results, heartbeats, log lines and signal
acknowledgements pile up
while a flush is in progress and go out together in the next one, so under
load one statement carries many messages and at rest a message is written
at once. Starts are committed before results in every pass; a result or log
line for a run whose start is still on its way waits for the next pass.
A start that came in during a pass waits out the next one too, unless its result
is there: a start written with its result is one change instead of two.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from dispatcher import sql
from dispatcher.protocol import LogLine, Result
from dispatcher.relay import Relay
from dispatcher.retries import write_retried
from dispatcher.session import InFlight
from signals import sql as signals_sql
from tasks.sql import outcomes
from valka.arrays import BinaryArray
from valka.db import next_retry_wait

log = logging.getLogger("valka.dispatcher")


@dataclass(frozen=True)
class WriterSettings:
    node_id: str  # the node whose claims the starts move (tasks.claimed_by)
    lease_extension: float  # seconds a heartbeat extends a lease by
    retry_params: dict[str, float] = field(default_factory=dict)  # tasks.retry.RetryPolicy.sql_params()
    buffer_bytes: int = 32 * 1024 * 1024  # what the buffer may hold before the node waits for it


UNSEND_ATTEMPTS = 8  # tries to put back unsent tasks before leaving them to the scheduler's reaper
ITEM = 200  # bytes counted for each buffered item, besides its text
HEARTBEAT_ITEM = 64  # and for each task id of a heartbeat


def _size(item: Any) -> int:
    """What a buffered item counts for against `buffer_bytes`."""
    if isinstance(item, Result):
        return ITEM + len(item.value or "")
    if isinstance(item, LogLine):
        return ITEM + len(item.message) + len(item.metadata or "")
    return ITEM  # a start, an acknowledgement


class Writer:
    """`relay` takes the signals waiting for the tasks a pass starts and sends them after its commit;
    `cancel(task_id, reason)` stops a task on its worker when its start lost a race."""

    def __init__(self, *, pool: AsyncConnectionPool, settings: WriterSettings, relay: Relay,
                 cancel: Callable[[str, str], None]) -> None:
        self.pool = pool
        self.settings = settings
        self.relay = relay
        self.cancel = cancel
        self._background: set[asyncio.Task] = set()
        self._starts: list[tuple[InFlight, str, int]] = []  # (entry, worker id, the pass it came in)
        self._passes = 0  # passes begun
        self._results: list[Result] = []
        self._heartbeats: list[tuple[str, str]] = []  # (worker id, task id)
        self._heard: dict[str, str] = {}  # session id by worker id, of the workers that sent a heartbeat
        self._logs: list[LogLine] = []
        self._acks: list[tuple[str, str]] = []  # (worker id, signal id)
        # Tasks sent whose start is not settled yet: DISPATCHING in the database, and no longer held
        # by their session once a result came back first. The sweep must not take them for unheard.
        self.starting: set[str] = set()
        self._wake = asyncio.Event()
        self._bytes = 0  # what the buffer holds, as `_size` counts it
        self.room = asyncio.Event()  # set while the buffer is under its bound
        self.room.set()
        # Told the results each pass has committed, when something waits for that (the slots of
        # held queues: dispatcher.handler.SessionHandler.results_written).
        self.written: Callable[[list[Result]], None] | None = None

    # -- producers (called from stream handlers; never block) --
    def start(self, entry: InFlight, worker_id: str) -> None:
        self._starts.append((entry, worker_id, self._passes))
        self.starting.add(entry.task_id)
        self._poke(ITEM)

    def result(self, result: Result) -> None:
        self._results.append(result)
        self._poke(_size(result))

    def heartbeat(self, worker_id: str, session_id: str, task_ids: list[str]) -> None:
        self._heard[worker_id] = session_id
        self._heartbeats.extend((worker_id, t) for t in task_ids)
        self._poke(HEARTBEAT_ITEM * len(task_ids))

    def logs(self, lines: list[LogLine]) -> None:
        self._logs.extend(lines)
        self._poke(sum(_size(line) for line in lines))

    def ack(self, worker_id: str, signal_id: str) -> None:
        self._acks.append((worker_id, signal_id))
        self._poke(ITEM)

    def unsend(self, task_ids: list[str]) -> None:
        """Put back, at once, tasks claimed for sessions that closed before they were sent:
        DISPATCHING → PENDING, no attempt counted. A failed try (a deadlock, a lock wait cut
        short, the database away) is tried again a few times; past those the scheduler's reaper
        puts them back, a dispatching timeout later."""
        async def write(conn: Any) -> None:
            await conn.execute(sql.UNSEND, {"task_ids": task_ids, "node_id": self.settings.node_id})

        task = asyncio.get_running_loop().create_task(write_retried(
            self.pool, write, attempts=UNSEND_ATTEMPTS, what=f"putting back {len(task_ids)} unsent task(s)"))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def pending(self) -> bool:
        return bool(self._starts or self._results or self._heartbeats or self._heard or self._logs or self._acks)

    def _poke(self, added: int) -> None:
        self._count(added)
        self._wake.set()

    def _count(self, delta: int) -> None:
        self._bytes += delta
        if self._bytes >= self.settings.buffer_bytes:
            self.room.clear()
        elif self._bytes <= self.settings.buffer_bytes // 2:
            self.room.set()

    # -- the loop --
    async def run(self, stop: asyncio.Event) -> None:
        backoff = 0.1
        while True:
            if not self.pending():
                if stop.is_set():
                    return
                waiter = asyncio.ensure_future(self._wake.wait())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
            self._wake.clear()
            try:
                await self.flush_once()
                backoff = 0.1
            except psycopg.OperationalError as exc:
                log.warning("dispatcher: the database is unreachable (%s); retrying in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = next_retry_wait(backoff)
            except psycopg.Error as exc:
                # PostgreSQL refused the pass itself: one bad row must not hold back everyone else's.
                log.error("dispatcher: a write was refused (%s); writing its items one by one", exc)
                try:
                    await self._isolate()
                except psycopg.Error:
                    log.exception("dispatcher: writing to the database failed; retrying in %.1fs", backoff)
                    await asyncio.sleep(backoff)
                    backoff = next_retry_wait(backoff)

    async def _isolate(self) -> None:
        """Write the buffered starts, results and log lines one at a time, each in its own
        transaction. An item PostgreSQL refuses is dropped; a refused result fails its task
        with a plain message instead, so the run is closed either way; a refused start counts
        as one that lost its race: its worker is told to stop the task."""
        # Every start is due here (none waits a pass for its result): each is written on its own.
        buckets = {"_starts": [(entry, worker_id, 0) for entry, worker_id, _ in self._starts],
                   "_results": self._results, "_logs": self._logs, "_acks": self._acks}
        self._starts, self._results, self._logs, self._acks = [], [], [], []
        waiting: dict[str, list[Any]] = {name: [] for name in buckets}
        try:
            for name, items in buckets.items():
                while items:
                    item = items.pop(0)
                    setattr(self, name, [item])
                    try:
                        await self.flush_once()
                    except psycopg.OperationalError:
                        raise
                    except psycopg.Error as exc:
                        setattr(self, name, [])
                        self._count(-_size(item))
                        log.error("dispatcher: dropped a %s PostgreSQL refused: %s", name.strip("_"), exc)
                        if name == "_starts":
                            # The task stays DISPATCHING (the reaper puts it back): the worker that
                            # has its assignment must stop, and the run's result waits for nothing.
                            self._settle_starts([item[:2]], set())
                        if isinstance(item, Result):
                            self._results = [Result(item.run_id, item.worker_id, False, False,
                                                    f"the worker's result could not be stored ({exc.sqlstate})",
                                                    None)]
                            self._count(_size(self._results[0]))
                            await self.flush_once()
                    waiting[name].extend(getattr(self, name))  # not ready yet: kept for later
                    setattr(self, name, [])
        finally:
            for name, items in buckets.items():
                setattr(self, name, waiting[name] + getattr(self, name) + items)

    async def flush_once(self) -> None:
        """Write everything buffered in ONE transaction: one commit (one WAL flush) per pass.

        Starts go first, so a result of a run started in this same pass finds its run row.
        On any error the whole pass rolls back and every item goes back to its buffer.
        """
        self._passes += 1
        # A start that came in since the last pass began waits this pass out unless its result is
        # here: under load most results come back within it, and a start written with its result
        # costs about half the two written apart. A start waits one pass at most.
        answered = {id(r.gate) for r in self._results if r.gate is not None}
        starts, waiting = [], []
        for entry, worker_id, seen in self._starts:
            if seen < self._passes - 1 or id(entry) in answered:
                starts.append((entry, worker_id))
            else:
                waiting.append((entry, worker_id, seen))
        self._starts = waiting
        starting = {id(entry): worker_id for entry, worker_id in starts}  # this pass's starts

        def ready(gate: InFlight | None) -> bool:
            return gate is None or gate.started.done() or id(gate) in starting

        results = [r for r in self._results if ready(r.gate)]
        self._results = [r for r in self._results if not ready(r.gate)]
        lines = [line for line in self._logs if ready(line.gate)]
        self._logs = [line for line in self._logs if not ready(line.gate)]
        beats, self._heartbeats = self._heartbeats, []
        heard, self._heard = self._heard, {}
        acks, self._acks = self._acks, []
        if not (starts or results or lines or beats or heard or acks):
            # Nothing to write yet: starts that wait for their results (the next pass writes them),
            # or results and lines whose start is still on its way from a stream handler, which
            # must get to run before the next pass looks again.
            await asyncio.sleep(0.001 if self._results or self._logs else 0)
            return
        try:
            async with self.pool.connection() as conn, conn.transaction():
                completed = await self._write_completed(conn, starting, results)
                rest = [(entry, w) for entry, w in starts if entry.task_id not in completed]
                started, taken = await self._write_starts(conn, rest) if rest else (set(), [])
                started |= completed
                left = [r for r in results if r.gate is None or r.gate.task_id not in completed]
                if left:
                    await self._write_results(conn, left)
                if beats:
                    await conn.execute(sql.HEARTBEAT, {
                        "worker_ids": BinaryArray(w for w, _ in beats), "task_ids": BinaryArray(t for _, t in beats),
                        "extension": self.settings.lease_extension,
                    })
                if heard:
                    await conn.execute(sql.TOUCH_WORKERS, {"worker_ids": sorted(heard),
                                                           "session_ids": [heard[w] for w in sorted(heard)],
                                                           "node_id": self.settings.node_id})
                if lines:
                    await conn.execute(sql.INSERT_LOGS, {
                        "run_ids": BinaryArray(line.run_id for line in lines),
                        "ts_ms": BinaryArray(line.ts_ms for line in lines),
                        "levels": BinaryArray(line.level for line in lines),
                        "messages": BinaryArray(line.message for line in lines),
                        "metadata": BinaryArray(line.metadata for line in lines),
                    })
                if acks:
                    await conn.execute(signals_sql.ACKNOWLEDGE, {"ids": BinaryArray(s for _, s in acks),
                                                                 "worker_ids": BinaryArray(w for w, _ in acks)})
        except BaseException:
            self._starts[:0] = [(e, w, 0) for e, w in starts]  # due again at the next pass
            self._results[:0] = results
            self._logs[:0] = lines
            self._heartbeats[:0] = beats
            self._heard = {**heard, **self._heard}
            self._acks[:0] = acks
            raise
        self._count(-(ITEM * len(starts) + sum(_size(r) for r in results) + sum(_size(line) for line in lines)
                      + HEARTBEAT_ITEM * len(beats) + ITEM * len(acks)))
        self._settle_starts(starts, started)
        if self.written is not None and results:
            self.written(results)
        if taken:  # marked DELIVERED in this pass: sent only now that it has committed
            await self.relay.send_taken(taken)
        if self._results or self._logs:
            # Some wait for a start still on its way from a stream handler; look again shortly.
            await asyncio.sleep(0.001)
            self._wake.set()

    async def _write_completed(self, conn: Any, starting: dict[int, str], results: list[Result]) -> set[str]:
        """The successful results whose start is in this same pass (`starting`: the starts' worker
        ids by id of their entries), each written with its start as one change
        (sql.START_COMPLETED_RUNS); returns the ids of the tasks written so. The rest (a task with
        signals waiting, a pass while task events are watched, a start that lost its race) go on to
        START_RUNS and the results' statements, as if this had not run."""
        if not starting or not results:
            return set()
        pairs = [(r.gate, r) for r in results
                 if r.success and r.gate is not None and starting.get(id(r.gate)) == r.worker_id]
        if not pairs:
            return set()
        cur = await conn.execute(sql.START_COMPLETED_RUNS, {
            "task_ids": BinaryArray(entry.task_id for entry, _ in pairs),
            "run_ids": BinaryArray(entry.run_id for entry, _ in pairs),
            "worker_ids": BinaryArray(r.worker_id for _, r in pairs),
            "values": BinaryArray(r.value for _, r in pairs),
            "node_id": self.settings.node_id,
        })
        return {task_id for task_id, in await cur.fetchall()}

    async def _write_starts(self, conn: Any, starts: list[tuple[InFlight, str]]) -> tuple[set[str], list[tuple]]:
        """DISPATCHING → RUNNING with run rows; returns the task ids that moved and the signals
        that waited for them, taken in this transaction (to send after its commit)."""
        cur = await conn.execute(sql.START_RUNS, {
            "task_ids": BinaryArray(e.task_id for e, _ in starts),
            "run_ids": BinaryArray(e.run_id for e, _ in starts),
            "worker_ids": BinaryArray(w for _, w in starts),
            "node_id": self.settings.node_id,
        })
        rows = await cur.fetchall()
        with_signals = [task_id for task_id, has_signals in rows if has_signals]
        taken = await self.relay.take(conn, with_signals) if with_signals else []
        return {task_id for task_id, _ in rows}, taken

    def _settle_starts(self, starts: list[tuple[InFlight, str]], started: set[str]) -> None:
        for entry, _ in starts:
            self.starting.discard(entry.task_id)
            ok = entry.task_id in started
            if not entry.started.done():
                entry.started.set_result(ok)
            if not ok:
                # Cancelled between claim and send: the worker must stop it.
                self.cancel(entry.task_id, "task was cancelled before it started")

    async def _write_results(self, conn: Any, results: list[Result]) -> None:
        done = [r for r in results if r.success]
        failed = [r for r in results if not r.success and not r.retryable]
        retry = [r for r in results if not r.success and r.retryable]
        if done:
            await outcomes.complete_runs(conn, [r.run_id for r in done], [r.worker_id for r in done],
                                         [r.value for r in done])
        if failed:
            await outcomes.fail_runs(conn, [r.run_id for r in failed], [r.worker_id for r in failed],
                                     [r.value or "failed" for r in failed])
        if retry:
            await outcomes.retry_runs(conn, [r.run_id for r in retry], [r.worker_id for r in retry],
                                      [r.value or "failed" for r in retry], lost=False,
                                      retry_params=self.settings.retry_params)

