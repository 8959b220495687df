"""The delayed promoter: announces scheduled tasks to the dispatchers when their time comes.

A PENDING task created with a future `run_at` is claimable from then on, but
nothing wakes the dispatchers at that moment. This loop remembers up to when
it has looked (the watermark, on the database clock) and each pass sends one
`NOTIFY valka_task_ready, <queue>` per queue with tasks that fell due since.
It moves and locks nothing: the NOTIFY only wakes dispatchers, who claim as
usual (and poll anyway, so a missed wake-up costs a poll interval, no task).

Tasks due at once are announced by whoever makes them PENDING (enqueue, the
retry engine, the reaper), so only delayed tasks (`run_at > created_at`) are
looked at, through their own small partial index.
"""

from __future__ import annotations

from contextlib import nullcontext
from datetime import datetime

from psycopg_pool import AsyncConnectionPool

from tasks.scheduler.base import DB, UNKNOWN, Loop, SchedulerConfig, connection
from tasks.sql import maintenance

# On its first pass (and after taking over from another scheduler) the promoter also
# announces tasks that fell due this long before: whatever the previous leader may have missed.
LOOKBACK_SECONDS = 60.0


class DelayedPromoter(Loop):
    name = "delayed promoter"

    def __init__(self, config: SchedulerConfig | None = None, pool: AsyncConnectionPool | None = None) -> None:
        super().__init__(config, pool)
        self.watermark: datetime | None = None

    async def run_once(self, db: DB, now: datetime | None = None) -> int:
        """Announce the delayed tasks that fell due in (watermark, now]; the watermark moves
        to `now` only once the NOTIFYs are committed, so a failed pass is repeated, not lost."""
        async with connection(db) as conn:
            # One statement: on an autocommit connection (the pool's) it is its own transaction, and
            # its NOTIFYs are sent at its commit, before execute returns. BEGIN and COMMIT around it
            # would add two round trips to every pass, once a second while idle.
            async with nullcontext() if conn.autocommit else conn.transaction():
                cur = await conn.execute(maintenance.DUE_DELAYED, {
                    "now": now, "since": self.watermark, "lookback": LOOKBACK_SECONDS})
                rows = await cur.fetchall()
        self.watermark = rows[0][0]
        # The next delayed task's due time, seen from the real clock only (`now` moves it in tests).
        self.next_due = rows[0][4] if now is None else UNKNOWN
        due = sum(row[2] for row in rows)
        queues = sum(1 for row in rows if row[1] is not None)
        if due:
            return self.report(**{f"delayed tasks due, announced on {queues} queue(s)": due})
        return 0

    async def next_delay(self, db: DB) -> float:
        """Sleep until the next delayed task falls due (bounded by max_sleep), as the pass just
        made saw it when it ran on the real clock."""
        return await self.sleep_until_due(db, maintenance.NEXT_DELAYED_DUE)

    def reset(self) -> None:
        """Forget the watermark (on gaining leadership): the next pass looks back LOOKBACK_SECONDS."""
        self.watermark = None
