"""The worker janitor: workers nobody has heard from are disconnected, their runs lost.

A dispatcher refreshes `workers.last_heartbeat_at` for every worker it
serves and marks a worker DISCONNECTED itself when its stream ends. If the
dispatcher dies, nobody does: after `worker_timeout` this loop marks such
workers DISCONNECTED and closes their RUNNING runs as lost ("worker
disconnected"), exactly as the dispatcher would have, so their tasks retry
without waiting for the (possibly long) lease to run out. Silence is counted
only from when this scheduler could see the database (`watching_since`): after
an outage, no worker is judged before `worker_timeout` has passed since its end.

It also forgets task event watchers whose session has ended without saying so
(a process killed while it streamed events), so PostgreSQL stops building
events for them.
"""

from __future__ import annotations

from datetime import datetime

import psycopg

from tasks.scheduler.base import DB, Loop, connection
from tasks.sql import maintenance, outcomes

WORKER_DISCONNECTED = "worker disconnected"


class WorkerJanitor(Loop):
    name = "worker janitor"

    async def batch(self, conn: psycopg.AsyncConnection, now: datetime | None = None) -> tuple[int, int]:
        """Up to one batch of silent workers → DISCONNECTED and their runs → LOST (tasks → RETRY
        or DEAD_LETTER), in the caller's transaction. Returns (workers, tasks moved).

        A worker whose dispatcher touches it (or that reconnects) at this moment is skipped or
        no longer matches the guard, and stays CONNECTED. A run whose row or task is busy is
        skipped too; it keeps its lease and the lease reaper closes it later if need be."""
        cur = await conn.execute(maintenance.STALE_WORKERS, {
            "now": now, "limit": self.config.batch_size, "timeout": self.config.worker_timeout,
            "since": self.watching_since})
        workers = [row[0] for row in await cur.fetchall()]
        if not workers:
            return 0, 0
        cur = await conn.execute(maintenance.RUNS_OF_WORKERS, {"worker_ids": workers})
        runs = await cur.fetchall()
        if not runs:
            return len(workers), 0
        moved = await outcomes.retry_runs(
            conn, [run_id for run_id, _ in runs], [worker_id for _, worker_id in runs],
            [WORKER_DISCONNECTED] * len(runs), lost=True, retry_params=self.config.retry_params)
        return len(workers), len(moved)

    async def run_once(self, db: DB, now: datetime | None = None) -> int:
        tasks = 0

        async def batch(conn: psycopg.AsyncConnection) -> int:
            nonlocal tasks
            workers, moved = await self.batch(conn, now)
            tasks += moved
            return workers

        async with connection(db) as conn:
            workers = await self.repeat(conn, batch)
            await conn.execute(maintenance.PRUNE_EVENT_WATCHERS)  # housekeeping, not counted
        return self.report(**{"silent workers → DISCONNECTED": workers, "tasks → RETRY/DEAD_LETTER": tasks})
