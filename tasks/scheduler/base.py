"""What every scheduler loop shares: its settings, its shape, and how it survives errors.

A loop is an object with `run_once(db, now=None) -> int` (one pass: batches
until nothing is due, each batch its own transaction; returns how many rows
it moved) and `run(stop)` (passes until `stop` is set, sleeping in between).
Tests call `run_once()` directly with an explicit `now`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime

import psycopg
from psycopg_pool import AsyncConnectionPool

from tasks.retry import RetryPolicy
from tasks.sql import maintenance

log = logging.getLogger("valka.scheduler")

MIN_SLEEP = 0.05  # never spin, even when something is overdue but locked by someone else
DUE_SLACK = 0.01  # wake just after a due time, not a hair before it
MAX_BACKOFF = 30.0  # after repeated errors (database down), retry at least this often
UNKNOWN = object()  # `Loop.next_due` when no pass has said when the next item is due


@dataclass(frozen=True)
class SchedulerConfig:
    batch_size: int = 500
    max_sleep: float = 1.0  # upper bound of a due-time sleep (retry engine, promoter)
    reaper_interval: float = 30.0  # lease reaper and worker janitor
    dispatching_timeout: float = 60.0
    worker_timeout: float = 120.0
    retention_interval: float = 600.0
    counter_fold_interval: float = 5.0
    retention_days: float = 7.0
    dead_letter_retention_days: float = 30.0
    lease_grace: float = 60.0  # the dispatchers' lease extension (see tasks.sql.maintenance.EXPIRED_LEASES)
    retry_params: dict[str, float] = field(default_factory=lambda: RetryPolicy().sql_params())

    @classmethod
    def from_settings(cls) -> SchedulerConfig:
        from valka.conf import valka_settings as s

        return cls(
            batch_size=int(s.SCHEDULER_BATCH_SIZE),
            max_sleep=float(s.SCHEDULER_MAX_SLEEP),
            reaper_interval=float(s.REAPER_INTERVAL),
            dispatching_timeout=float(s.DISPATCHING_TIMEOUT),
            worker_timeout=float(s.WORKER_TIMEOUT),
            retention_interval=float(s.RETENTION_INTERVAL),
            counter_fold_interval=float(s.COUNTER_FOLD_INTERVAL),
            retention_days=float(s.RETENTION_DAYS),
            dead_letter_retention_days=float(s.DEAD_LETTER_RETENTION_DAYS),
            lease_grace=float(s.LEASE_EXTENSION),
            retry_params=RetryPolicy.from_settings().sql_params(),
        )


DB = AsyncConnectionPool | psycopg.AsyncConnection


@asynccontextmanager
async def connection(db: DB) -> AsyncIterator[psycopg.AsyncConnection]:
    """A connection from a pool (returned afterwards), or the connection itself."""
    if isinstance(db, AsyncConnectionPool):
        async with db.connection() as conn:
            yield conn
    else:
        yield db


async def sleep_or_stop(stop: asyncio.Event, seconds: float, wake: asyncio.Event | None = None) -> None:
    """Sleep `seconds`, or less if `stop` (or `wake`, when given) is set meanwhile."""
    if wake is None:
        try:
            await asyncio.wait_for(stop.wait(), max(seconds, 0.0))
        except TimeoutError:
            pass
        return
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=max(seconds, 0.0), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def jittered(seconds: float, spread: float = 0.1) -> float:
    """`seconds` ± `spread`, so several loops (or schedulers) do not fire in step."""
    return seconds * (1.0 + spread * (2.0 * random.random() - 1.0))


class Loop:
    """The shape of a loop. Subclasses implement `run_once` and, if they know when
    their next item is due, `next_delay`; the default is a fixed, jittered interval.
    Setting `wake` (from a LISTEN handler, say) cuts the sleep short: the next pass starts at once."""

    name = "loop"

    def __init__(self, config: SchedulerConfig | None = None, pool: AsyncConnectionPool | None = None) -> None:
        self.config = config or SchedulerConfig.from_settings()
        self.pool = pool
        self._stop: asyncio.Event | None = None
        # Since when the database has been writable for everyone, as far as this loop knows: the
        # later of PostgreSQL's start (an outage that stopped it ended then) and this process's
        # return to the database after losing it (a failed pass, or a lost leader lock). Set by
        # `run` before its first pass of a term; None in `run_once` called alone, as tests do.
        # Loops that judge deadlines count only time after it (tasks.sql.maintenance.SINCE).
        self.watching_since: datetime | None = None
        self._lost_access = False  # since the last time `watching_since` was set
        self._returned_at: datetime | None = None
        self.wake = asyncio.Event()
        # Seconds until the next item is due (None: nothing waits), when the pass just made learned
        # it on its way: `sleep_until_due` then needs no statement of its own. Read once.
        self.next_due: float | None | object = UNKNOWN

    @property
    def interval(self) -> float:
        return self.config.reaper_interval

    @property
    def stopping(self) -> bool:
        """Checked between batches: a stop (or lost leadership) ends the pass after the batch in hand."""
        return self._stop is not None and self._stop.is_set()

    def lost_access(self) -> None:
        """This process could not reach the database for a while (its leader lock connection died)."""
        self._lost_access = True
        self.watching_since = None

    async def _watch(self, db: DB) -> datetime:
        async with connection(db) as conn:
            now, started = await (await conn.execute(maintenance.DB_CLOCK)).fetchone()
        if self._lost_access:
            self._returned_at, self._lost_access = now, False
        return max(started, self._returned_at) if self._returned_at else started

    async def run_once(self, db: DB, now: datetime | None = None) -> int:
        raise NotImplementedError

    async def next_delay(self, db: DB) -> float:
        return jittered(self.interval)

    async def sleep_until_due(self, db: DB, statement: str) -> float:
        """The sleep before the next pass of a loop that knows when its next item is due:
        `statement` returns the seconds until then (NULL if nothing waits), unless the pass set
        `next_due`. Bounded by `max_sleep`, because new items can appear without waking us."""
        due, self.next_due = self.next_due, UNKNOWN
        if due is UNKNOWN:
            async with connection(db) as conn:
                cur = await conn.execute(statement)
                row = await cur.fetchone()
            due = row[0] if row else None
        if due is None:
            return self.config.max_sleep
        return min(self.config.max_sleep, max(MIN_SLEEP, due + DUE_SLACK))

    async def repeat(self, conn: psycopg.AsyncConnection,
                     batch: Callable[[psycopg.AsyncConnection], Awaitable[int]]) -> int:
        """Run `batch` in a transaction of its own until it handles less than a full batch
        (nothing more is due) or a stop is asked for. Returns the rows handled in all.
        A process killed mid-batch rolls back that batch only: no row is half-moved."""
        total = 0
        while True:
            async with conn.transaction():
                handled = await batch(conn)
            total += handled
            if handled < self.config.batch_size or self.stopping:
                return total

    def report(self, **counts: int) -> int:
        """Log one line if the pass moved anything; returns the total."""
        total = sum(counts.values())
        if total:
            parts = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
            log.info("%s: %s", self.name, parts)
        return total

    async def run(self, stop: asyncio.Event) -> None:
        """Pass, sleep, repeat until `stop`. An error (database restarting, connection lost)
        is logged and retried with a growing backoff; the pool replaces broken connections."""
        if self.pool is None:
            raise RuntimeError(f"{self.name}: run() needs a pool")
        self._stop = stop
        self.watching_since = None  # a new term: look again
        failures = 0
        while not stop.is_set():
            try:
                if self.watching_since is None:
                    self.watching_since = await self._watch(self.pool)
                self.wake.clear()  # a wake-up from here on is seen after this pass
                await self.run_once(self.pool)
                delay = await self.next_delay(self.pool)
                if failures:
                    log.info("%s: database reachable again", self.name)
                failures = 0
            except (psycopg.Error, OSError) as exc:
                self.lost_access()  # the database may be out of reach for everyone
                failures += 1
                delay = min(MAX_BACKOFF, 0.5 * 2 ** min(failures, 10))
                log.warning("%s: %s: %s; retrying in %.1fs", self.name, type(exc).__name__,
                            str(exc).strip() or "no detail", delay)
            except Exception:
                failures += 1
                delay = min(MAX_BACKOFF, 0.5 * 2 ** min(failures, 10))
                log.exception("%s: pass failed; retrying in %.1fs", self.name, delay)
            await sleep_or_stop(stop, max(delay, MIN_SLEEP), self.wake)
