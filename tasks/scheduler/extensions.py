"""What other apps add to the scheduler: tasks imports none of them; they fill these lists from
their `AppConfig.ready()` (as the signals app adds its statement to `tasks.sql.outcomes.ON_RETRY`).

- `LOOPS`: factories of extra loops, each called with the scheduler's config and pool when a
  `Scheduler` is built; the loops run beside the built-in ones while the scheduler leads.
- `ON_START`: functions `run_scheduler` calls once before it campaigns (synchronous, with the
  ORM at hand). One that raises `tasks.errors.ValkaError` stops the command with its message; one
  that cannot reach the database is tried again until it can (`run_on_start`), as a scheduler
  started during an outage waits it out like its loops do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import InterfaceError, OperationalError, close_old_connections, connection
from psycopg_pool import AsyncConnectionPool

from tasks.scheduler.base import Loop, SchedulerConfig

LoopFactory = Callable[[SchedulerConfig, AsyncConnectionPool], Loop]

log = logging.getLogger("valka.scheduler")

LOOPS: list[LoopFactory] = []
ON_START: list[Callable[[], None]] = []


def add_loop(factory: LoopFactory) -> None:
    """Register `factory` once (an app's `ready()` may run more than once in tests)."""
    if factory not in LOOPS:
        LOOPS.append(factory)


def add_on_start(hook: Callable[[], None]) -> None:
    if hook not in ON_START:
        ON_START.append(hook)


def run_on_start(*, first_delay: float = 0.5, max_delay: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """Call every ON_START hook once it has run through: one that cannot reach the database (down,
    or restarting) is called again after a backoff, on a fresh connection, until it can. Any other
    error is the hook's to raise."""
    for hook in ON_START:
        delay = first_delay
        while True:
            try:
                hook()
                break
            except (OperationalError, InterfaceError) as exc:
                log.warning("scheduler: %s could not reach the database (%s); trying again in %.1fs",
                            getattr(hook, "__name__", hook), " ".join(str(exc).split())[:200], delay)
                connection.close()
                close_old_connections()
                sleep(delay)
                delay = min(delay * 2, max_delay)
