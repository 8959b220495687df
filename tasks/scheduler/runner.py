"""The scheduler process: leader election plus every loop, until SIGTERM/SIGINT.

While this process leads, each loop (the built-in ones and those other apps registered in
`extensions.LOOPS`) runs as its own asyncio task on a shared pool. When leadership is lost
(lock connection gone) or a stop is asked for, the loops finish the batch in hand (each batch
is one transaction, so stopping between batches leaves nothing half-moved) and pause; only
then is the lock connection closed, so a successor never overlaps a batch of ours after a
clean stop. A standby keeps campaigning and starts the loops afresh when it wins.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from psycopg_pool import AsyncConnectionPool

from tasks.scheduler import extensions
from tasks.scheduler.base import Loop, SchedulerConfig
from tasks.scheduler.counters import CounterFold
from tasks.scheduler.janitor import WorkerJanitor
from tasks.scheduler.leader import Leader
from tasks.scheduler.promoter import DelayedPromoter
from tasks.scheduler.reaper import LeaseReaper
from tasks.scheduler.retention import Retention
from tasks.scheduler.retry import RetryEngine
from valka.db import conninfo, make_pool

log = logging.getLogger("valka.scheduler")


async def wait_any(*events: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


class Scheduler:
    def __init__(self, config: SchedulerConfig | None = None, *, pool: AsyncConnectionPool | None = None,
                 leader: Leader | None = None) -> None:
        self.config = config or SchedulerConfig.from_settings()
        name = f"valka-scheduler {os.getpid()}"
        self.pool = pool or make_pool(name, min_size=1, max_size=5)
        # The lock is held by a session: the leader's connection must have one of its own.
        self.leader = leader or Leader(conninfo(application_name=f"{name} leader", direct=True))
        self.loops: list[Loop] = [
            cls(self.config, self.pool)
            for cls in (RetryEngine, DelayedPromoter, LeaseReaper, WorkerJanitor, Retention, CounterFold)
        ]
        self.loops += [make(self.config, self.pool) for make in extensions.LOOPS]  # other apps' loops
        self.terms = 0  # how many times this process became leader

    async def run(self, stop: asyncio.Event) -> None:
        await self.pool.open(wait=False)
        election_stop = asyncio.Event()
        election = asyncio.create_task(self.leader.run(election_stop), name="leader election")
        try:
            while not stop.is_set():
                await wait_any(self.leader.leading, stop)
                if stop.is_set():
                    break
                await self._lead(stop)
        finally:
            election_stop.set()
            await election
            await self.pool.close()

    async def _lead(self, stop: asyncio.Event) -> None:
        """One term as leader: all loops until stop or demotion, then wait for their batches."""
        self.terms += 1
        term = asyncio.Event()
        for loop in self.loops:
            if isinstance(loop, DelayedPromoter):
                loop.reset()  # look back over what a previous leader may have missed
        tasks = [asyncio.create_task(loop.run(term), name=loop.name) for loop in self.loops]
        log.info("scheduler: loops running (%s)", ", ".join(loop.name for loop in self.loops))
        await wait_any(stop, self.leader.standby)
        term.set()
        await asyncio.gather(*tasks)
        if not stop.is_set():
            for loop in self.loops:
                loop.lost_access()  # the lock connection died: so, likely, did everyone's
            log.warning("scheduler: no longer leader; loops paused")


async def serve(config: SchedulerConfig | None = None) -> None:
    """Run a scheduler until SIGTERM or SIGINT (the command's body)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("scheduler: starting (pid %d)", os.getpid())
    await Scheduler(config).run(stop)
    log.info("scheduler: stopped")
