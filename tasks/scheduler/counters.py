"""The counter fold: the throughput counts the tasks table's triggers append, added into their
minutes every `counter_fold_interval` (5 s by default), and minutes older than two hours folded
into one total row per queue and kind (tasks/sql/schema/counters.sql).

The triggers append rather than update a counter row, which keeps a lock and a row version off
every enqueue; the price is a table that grows by a row per statement until this loop empties it.
/metrics and the overview read both tables, so a count is visible from its commit, and they stay
read-only: folding is this loop's alone. A scheduler that stays down leaves the deltas growing,
which slows those reads (a full scan of a few MB a minute at a thousand statements a second)
until the next pass moves them all.
"""

from __future__ import annotations

from datetime import datetime

from tasks.scheduler.base import DB, Loop, connection
from tasks.sql import maintenance


class CounterFold(Loop):
    name = "counter fold"

    @property
    def interval(self) -> float:
        return self.config.counter_fold_interval

    async def run_once(self, db: DB, now: datetime | None = None) -> int:
        async with connection(db) as conn:
            cur = await conn.execute(maintenance.FOLD_COUNTERS)
            row = await cur.fetchone()
        return row[0] if row else 0
