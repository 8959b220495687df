"""Retention: keeps the hot tables small on a long-running install.

- Finished tasks (COMPLETED, FAILED, CANCELLED) whose `finished_at` is older
  than `retention_days` are deleted; their runs, logs and signals go with
  them (ON DELETE CASCADE in the database).
- Dead letters older than `dead_letter_retention_days` are deleted with their
  DEAD_LETTER task; so are DEAD_LETTER tasks that old whose dead letter was
  deleted by hand.
- Workers disconnected for more than `retention_days` are deleted (a worker
  process that restarts with a new id leaves one row behind each time).

Deleting a finished task frees its idempotency key: a task sent again with
that key after `retention_days` is a new task.

Deletes run oldest first in batches of `batch_size`, one transaction each,
so a huge backlog never holds locks for long. Nothing that is not final is
ever touched. Runs every `retention_interval` (10 minutes by default).
"""

from __future__ import annotations

from datetime import datetime

import psycopg

from tasks.scheduler.base import DB, Loop, connection
from tasks.sql import maintenance


class Retention(Loop):
    name = "retention"

    @property
    def interval(self) -> float:
        return self.config.retention_interval

    def _params(self, now: datetime | None, days: float) -> dict:
        return {"now": now, "days": days, "limit": self.config.batch_size}

    async def finished_batch(self, conn: psycopg.AsyncConnection, now: datetime | None = None) -> int:
        """Up to one batch of old finished tasks deleted, in the caller's transaction."""
        cur = await conn.execute(maintenance.PRUNE_FINISHED, self._params(now, self.config.retention_days))
        return len(await cur.fetchall())

    async def dead_letter_batch(self, conn: psycopg.AsyncConnection, now: datetime | None = None) -> int:
        """Up to one batch of old dead letters deleted with their tasks, in the caller's transaction."""
        cur = await conn.execute(maintenance.PRUNE_DEAD_LETTERS,
                                 self._params(now, self.config.dead_letter_retention_days))
        return len(await cur.fetchall())

    async def orphan_batch(self, conn: psycopg.AsyncConnection, now: datetime | None = None) -> int:
        """Up to one batch of old DEAD_LETTER tasks without a dead letter deleted."""
        cur = await conn.execute(maintenance.PRUNE_ORPHAN_DEAD_LETTER_TASKS,
                                 self._params(now, self.config.dead_letter_retention_days))
        return len(await cur.fetchall())

    async def workers_batch(self, conn: psycopg.AsyncConnection, now: datetime | None = None) -> int:
        """Up to one batch of workers disconnected long ago deleted."""
        cur = await conn.execute(maintenance.PRUNE_WORKERS, self._params(now, self.config.retention_days))
        return len(await cur.fetchall())

    async def run_once(self, db: DB, now: datetime | None = None) -> int:
        async with connection(db) as conn:
            finished = await self.repeat(conn, lambda c: self.finished_batch(c, now))
            letters = await self.repeat(conn, lambda c: self.dead_letter_batch(c, now))
            orphans = await self.repeat(conn, lambda c: self.orphan_batch(c, now))
            workers = await self.repeat(conn, lambda c: self.workers_batch(c, now))
        return self.report(**{"finished tasks deleted": finished, "dead letters deleted": letters,
                              "orphaned DEAD_LETTER tasks deleted": orphans, "disconnected workers deleted": workers})
