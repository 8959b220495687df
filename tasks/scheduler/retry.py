"""The retry engine (and dead-letter mover): RETRY tasks become PENDING once their
backoff has elapsed, or DEAD_LETTER when they have no attempts left.

Whoever moves a task to RETRY sets `run_at` to the end of its backoff
(`valka_retry_delay`). This loop sleeps until the earliest such `run_at`
(bounded by `max_sleep`, since new RETRY tasks appear without a wake-up), so
a retry is claimable within about a second of its time.

Each pass first asks when the earliest RETRY task is due. With none in RETRY, the pass ends
there and its answer is the sleep: an idle scheduler makes one statement a second for this
loop, not two transactions and a probe.
"""

from __future__ import annotations

from datetime import datetime

import psycopg

from tasks.scheduler.base import DB, UNKNOWN, Loop, connection
from tasks.sql import lifecycle, maintenance


class RetryEngine(Loop):
    name = "retry engine"

    async def promote_batch(self, conn: psycopg.AsyncConnection, now: datetime | None = None) -> int:
        """Up to one batch of due RETRY tasks → PENDING, with one NOTIFY per queue, in the caller's
        transaction. Rows locked elsewhere are skipped; the NOTIFY is sent on commit only."""
        cur = await conn.execute(maintenance.RETRY_DUE, {"now": now, "limit": self.config.batch_size})
        return sum(row[1] for row in await cur.fetchall())

    async def dead_letter_batch(self, conn: psycopg.AsyncConnection) -> int:
        """Up to one batch of exhausted RETRY tasks → DEAD_LETTER with their dead-letter rows,
        in the caller's transaction. The rows are locked first, so DEAD_LETTER_TASKS never
        waits on them and a task being moved elsewhere at this moment is left for the next pass."""
        cur = await conn.execute(maintenance.RETRY_EXHAUSTED, {"limit": self.config.batch_size})
        ids = [row[0] for row in await cur.fetchall()]
        if not ids:
            return 0
        cur = await conn.execute(lifecycle.DEAD_LETTER_TASKS, {"ids": ids})
        return len(await cur.fetchall())

    async def run_once(self, db: DB, now: datetime | None = None) -> int:
        """Exhausted tasks first (they must never become PENDING), then the due ones. Exhausted
        tasks move whatever their due time, so only an empty RETRY set lets the pass stop early."""
        async with connection(db) as conn:
            row = await (await conn.execute(maintenance.NEXT_RETRY_DUE)).fetchone()
            if row is None or row[0] is None:
                self.next_due = None  # nothing waits: the sleep needs no second look
                return 0
            self.next_due = UNKNOWN  # what the batches leave is looked at afterwards
            dead = await self.repeat(conn, self.dead_letter_batch)
            promoted = await self.repeat(conn, lambda c: self.promote_batch(c, now))
        return self.report(**{"tasks → PENDING": promoted, "tasks → DEAD_LETTER": dead})

    async def next_delay(self, db: DB) -> float:
        """Sleep until the earliest RETRY task is due (bounded by max_sleep)."""
        return await self.sleep_until_due(db, maintenance.NEXT_RETRY_DUE)
