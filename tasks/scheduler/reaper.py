"""The lease reaper: recovers tasks whose worker or dispatcher vanished without a word.

- A RUNNING run whose lease has expired (no heartbeat extended it: the worker
  hangs or died and no dispatcher noticed) is closed as LOST ("lease
  expired"); its task goes to RETRY with its backoff, or on to DEAD_LETTER.
- A DISPATCHING task claimed longer than `dispatching_timeout` ago (its
  dispatcher died between claim and send) goes back to PENDING, no attempt
  counted, and the dispatchers are woken.

Neither is judged on time that passed while this scheduler could not reach the
database (`watching_since`): after an outage, a lease waits a whole lease
extension (`lease_grace`) and a claim `dispatching_timeout`, from the outage's
end, for the heartbeats and starts the dispatchers buffered meanwhile.

Closing runs is `outcomes.retry_runs`, the statement the dispatcher uses for
a disconnect, so a reaped task looks exactly like a lost one.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import psycopg

from tasks.scheduler.base import DB, Loop, connection
from tasks.sql import maintenance, outcomes

LEASE_EXPIRED = "lease expired"


class LeaseReaper(Loop):
    name = "lease reaper"

    async def lease_batch(self, conn: psycopg.AsyncConnection,
                          now: datetime | None = None) -> tuple[int, list[uuid.UUID]]:
        """Up to one batch of expired runs → LOST, their tasks → RETRY or DEAD_LETTER, in the
        caller's transaction. Returns (runs closed, ids of tasks moved).

        Each run is locked together with its task, and pairs that someone else holds
        are skipped: a heartbeat or a result in flight wins and the run is looked at
        again next pass (its lease extended, or closed). Once locked here, a heartbeat,
        result or cancel that comes next waits, then finds the run closed (or the task
        in RETRY, which cannot be cancelled) and changes nothing. A task already
        CANCELLED keeps its status: only its stale run is closed."""
        cur = await conn.execute(maintenance.EXPIRED_LEASES, {
            "now": now, "limit": self.config.batch_size, "since": self.watching_since,
            "grace": self.config.lease_grace})
        run_ids = [row[0] for row in await cur.fetchall()]
        if not run_ids:
            return 0, []
        moved = await outcomes.retry_runs(conn, run_ids, None, [LEASE_EXPIRED] * len(run_ids), lost=True,
                                          retry_params=self.config.retry_params)
        return len(run_ids), moved

    async def dispatching_batch(self, conn: psycopg.AsyncConnection, now: datetime | None = None) -> int:
        """Up to one batch of stuck DISPATCHING tasks → PENDING (claimed_by cleared), one NOTIFY per
        queue, in the caller's transaction. A dispatcher that was merely slow finds its task no
        longer DISPATCHING for it, so its late START moves nothing."""
        cur = await conn.execute(maintenance.STUCK_DISPATCHING, {
            "now": now, "limit": self.config.batch_size, "timeout": self.config.dispatching_timeout,
            "since": self.watching_since})
        return sum(row[1] for row in await cur.fetchall())

    async def run_once(self, db: DB, now: datetime | None = None) -> int:
        tasks: list[uuid.UUID] = []

        async def leases(conn: psycopg.AsyncConnection) -> int:
            closed, moved = await self.lease_batch(conn, now)
            tasks.extend(moved)
            return closed

        async with connection(db) as conn:
            closed = await self.repeat(conn, leases)
            unstuck = await self.repeat(conn, lambda c: self.dispatching_batch(c, now))
        return self.report(**{"expired runs → LOST": closed, "tasks → RETRY/DEAD_LETTER": len(tasks),
                              "DISPATCHING tasks → PENDING": unstuck})
