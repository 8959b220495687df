"""The idle slots a dispatcher offers producers, so that a task inserted on its own is handed to it
in its INSERT and sent without a claim (tasks/sql/producer.py INSERT_TASK).

On an idle system most of a new task's way to its handler is the processes waking each other:
the claim is a round trip to a PostgreSQL backend that was asleep, between two others (the
NOTIFY, the send). A task handed over in its INSERT, and announced with everything its worker
needs, skips that round trip.

An offer is a row of `queue_offers` per (queue, node): how many tasks of the queue producers may
hand over, on which channel, until when. The claimer says after each pass what it wants offered
(`update`): for a queue without controls whose last full claim came back short (nothing else of
it was due), up to OFFER_MAX of its free slots; for any other, nothing, so that a backlog is
claimed in order and a limit is kept by the claim. A row is written when that changes enough:
withdrawn at once, offered again once half of it was taken, refreshed before it lapses. The
writes never wait: a row a producer holds (its transaction still open) is skipped, and written
at a later pass.

What the rows say is a hint, never a promise: a dispatcher handed a task it cannot send puts it
back (PENDING), to be claimed as any other (dispatcher.claimer `Claimer.handed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from psycopg_pool import AsyncConnectionPool

from dispatcher import sql

OFFER_MAX = 16  # slots of a queue offered at once
TTL = 5.0  # seconds an offer lasts unless written again: a dead dispatcher's lapse within it
REFRESH = 2.0  # seconds after which a standing offer is written again


class Offers:
    """This node's rows in queue_offers, written on `pool` (the claim pool)."""

    def __init__(self, *, pool: AsyncConnectionPool, node_id: str, channel: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self.node_id = node_id
        self.channel = channel
        self.clock = clock
        self._offered: dict[str, int] = {}  # queue → slots as last written (less those taken since)
        self._written_at: dict[str, float] = {}
        self._swept = False
        self.ever: set[str] = set()  # every queue offered since the start (where handed tasks may be)

    def offered(self, queue: str) -> int:
        return self._offered.get(queue, 0)

    def took(self, queue: str) -> None:
        """A producer handed over a task of `queue`: one slot of its offer is gone."""
        if self._offered.get(queue, 0) > 0:
            self._offered[queue] -= 1

    async def update(self, wanted: Mapping[str, int]) -> int:
        """Bring the rows to `wanted` (queue → slots; a queue left out wants none) where they are
        far enough from it; returns how many rows were written."""
        now = self.clock()
        changes = []
        for queue in sorted(wanted.keys() | self._offered.keys()):
            want, have = wanted.get(queue, 0), self._offered.get(queue, 0)
            if want <= 0:
                if have > 0:
                    changes.append((queue, 0))
            elif have * 2 <= want or now - self._written_at.get(queue, float("-inf")) >= REFRESH:
                changes.append((queue, want))
        if not changes:
            return 0
        written = 0
        async with self.pool.connection() as conn:
            if not self._swept:  # once, at the first write: rows of dispatchers gone a while
                await conn.execute(sql.FORGET_LAPSED_OFFERS)
                self._swept = True
            for queue, slots in changes:
                cur = await conn.execute(sql.OFFER, {"queue": queue, "node_id": self.node_id, "channel": self.channel,
                                                     "slots": slots, "ttl": TTL}, prepare=True)
                row = await cur.fetchone()
                if row and row[0]:
                    written += 1
                    if slots:
                        self._offered[queue], self._written_at[queue] = slots, now
                        self.ever.add(queue)
                    else:
                        self._offered.pop(queue, None)
                        self._written_at.pop(queue, None)
        return written

    async def withdraw_all(self) -> None:
        """This node stops: its rows go (those a producer holds lapse within TTL)."""
        self._offered.clear()
        self._written_at.clear()
        async with self.pool.connection() as conn:
            await conn.execute(sql.WITHDRAW_OFFERS, {"node_id": self.node_id})
