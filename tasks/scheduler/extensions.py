"""What other apps add to the scheduler: tasks imports none of them; they fill these lists from
their `AppConfig.ready()` (as the signals app adds its statement to `tasks.sql.outcomes.ON_RETRY`).

- `LOOPS`: factories of extra loops, each called with the scheduler's config and pool when a
  `Scheduler` is built; the loops run beside the built-in ones while the scheduler leads.
- `ON_START`: functions `run_scheduler` calls once before it campaigns (synchronous, with the
  ORM at hand). One that raises `tasks.errors.ValkaError` stops the command with its message.
"""

from __future__ import annotations

from collections.abc import Callable

from psycopg_pool import AsyncConnectionPool

from tasks.scheduler.base import Loop, SchedulerConfig

LoopFactory = Callable[[SchedulerConfig, AsyncConnectionPool], Loop]

LOOPS: list[LoopFactory] = []
ON_START: list[Callable[[], None]] = []


def add_loop(factory: LoopFactory) -> None:
    """Register `factory` once (an app's `ready()` may run more than once in tests)."""
    if factory not in LOOPS:
        LOOPS.append(factory)


def add_on_start(hook: Callable[[], None]) -> None:
    if hook not in ON_START:
        ON_START.append(hook)
