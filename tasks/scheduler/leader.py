"""Leader election: of all running schedulers, the one holding an advisory lock acts.

The lock is `pg_try_advisory_lock(LOCK_KEY)`, held by the session of one
dedicated connection. PostgreSQL releases it when that session ends, so a
leader that dies (SIGKILL, crash, network gone) frees it by itself; a
standby tries again every `retry_interval` and takes over within about that
long of the server noticing. That connection must be a session of its own,
never one a transaction pooler lends out (valka.db.conninfo(direct=True)):
there the lock would stay with a server session after the leader is gone.

The leader asks its lock connection `SELECT 1` every `check_interval`. If
that fails or hangs past `check_timeout` it demotes itself at once (the
runner pauses its loops after the batch in hand) and goes back to
connecting and campaigning. Two schedulers may overlap for at most one check
interval around a failure; that is harmless, because every move is a
guarded update on rows locked with SKIP LOCKED, so no task is moved twice.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg

from tasks.scheduler.base import sleep_or_stop
from tasks.sql import maintenance
from valka.db import next_retry_wait

log = logging.getLogger("valka.scheduler")

# The advisory lock of the scheduler: the bytes "valkasch" as a signed 64-bit key.
LOCK_KEY = int.from_bytes(b"valkasch", "big", signed=True)


class Leader:
    def __init__(self, conninfo: str, *, key: int = LOCK_KEY, retry_interval: float = 1.0,
                 check_interval: float = 1.0, check_timeout: float = 3.0) -> None:
        self.conninfo = conninfo
        self.key = key
        self.retry_interval = retry_interval
        self.check_interval = check_interval
        self.check_timeout = check_timeout
        # Exactly one of the two is set at any time; the runner waits on either.
        self.leading = asyncio.Event()
        self.standby = asyncio.Event()
        self.standby.set()

    @property
    def is_leader(self) -> bool:
        return self.leading.is_set()

    def _set_leading(self, leading: bool) -> None:
        (self.standby if leading else self.leading).clear()
        (self.leading if leading else self.standby).set()

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign (and lead) until `stop`; on stop the connection closes, releasing the lock."""
        backoff = 0.5
        while not stop.is_set():
            conn: psycopg.AsyncConnection | None = None
            try:
                conn = await asyncio.wait_for(
                    psycopg.AsyncConnection.connect(self.conninfo, autocommit=True), self.check_timeout * 4)
                backoff = 0.5
                await self._campaign(conn, stop)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                detail = f"{type(exc).__name__}: {str(exc).strip() or 'no detail'}"
                if self.is_leader:
                    self._set_leading(False)
                    log.error("scheduler: lost the leader lock connection (%s); loops paused", detail)
                else:
                    log.warning("scheduler: leader election connection failed (%s); retrying in %.1fs",
                                detail, backoff)
                if conn is not None:  # a hung session may still hold the lock: let it go before waiting
                    await _close_quietly(conn)
                    conn = None
                await sleep_or_stop(stop, backoff)
                backoff = next_retry_wait(backoff)
            finally:
                self._set_leading(False)
                if conn is not None:
                    await _close_quietly(conn)

    async def _campaign(self, conn: psycopg.AsyncConnection, stop: asyncio.Event) -> None:
        said_standby = False
        while not stop.is_set():
            if not self.is_leader:
                cur = await asyncio.wait_for(
                    conn.execute(maintenance.TRY_LEADER_LOCK, [self.key]), self.check_timeout)
                row = await cur.fetchone()
                if row and row[0]:
                    self._set_leading(True)
                    log.info("scheduler: leader now (advisory lock %d held)", self.key)
                    continue
                if not said_standby:
                    log.info("scheduler: standby; another scheduler leads")
                    said_standby = True
                await sleep_or_stop(stop, self.retry_interval)
            else:
                await sleep_or_stop(stop, self.check_interval)
                if not stop.is_set():
                    await asyncio.wait_for(conn.execute(maintenance.LEADER_ALIVE), self.check_timeout)


async def _close_quietly(conn: psycopg.AsyncConnection) -> None:
    try:
        await asyncio.wait_for(conn.close(), 5.0)
    except (psycopg.Error, OSError, TimeoutError):
        pass
