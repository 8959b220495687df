"""What a dispatcher knows of the queues' controls (docs/queues.md): which queues are paused, and
until when; which are held to a running limit (max_running, max_running_per_key) or to a rate.

It only decides which claim a queue gets, and when to try it: none while paused, CLAIM without
controls, CLAIM_LIMITED with them (dispatcher/sql.py). Both statements check the queue's row
themselves, so what this holds may be a moment old without a claim ever taking what the row
forbids: a claim that finds the row changed says so, and the claimer has this read again.

Read again when a queue's controls change (NOTIFY valka_queue_changed), when a claim finds the row
changed, after the LISTEN connection came back, and at least every `max_age` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from psycopg import AsyncConnection

from dispatcher import sql

OPEN, PAUSED, LIMITED = "open", "paused", "limited"


@dataclass(frozen=True)
class Control:
    paused: bool
    resumes_at: float | None  # the clock's time the pause ends by itself; None: until resumed
    limited: bool  # a limit is set: max_running, rate_limit or max_running_per_key
    rated: bool  # rate_limit


class QueueControls:
    def __init__(self, *, max_age: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age = max_age
        self.clock = clock
        self._by_queue: dict[str, Control] = {}
        self._read_at: float | None = None

    def stale(self) -> bool:
        return self._read_at is None or self.clock() - self._read_at >= self.max_age

    def forgotten(self) -> bool:
        """Known to be out of date (a change was announced or found), not only old."""
        return self._read_at is None

    def forget(self) -> None:
        """Read them again before the next claim."""
        self._read_at = None

    async def read(self, conn: AsyncConnection) -> None:
        now = self.clock()
        rows = await (await conn.execute(sql.QUEUE_CONTROLS)).fetchall()
        self.known({
            name: Control(paused=paused, resumes_at=now + resumes_in if paused and resumes_in is not None else None,
                          limited=limited, rated=rated)
            for name, paused, resumes_in, limited, rated in rows
        }, at=now)

    def known(self, by_queue: dict[str, Control], *, at: float | None = None) -> None:
        """The queues with controls, as read `at` (now by default); every other queue has none.
        `read` tells it what the rows say; a test can tell it what it needs."""
        self._by_queue = dict(by_queue)
        self._read_at = self.clock() if at is None else at

    def mode(self, queue: str) -> str:
        control = self._by_queue.get(queue)
        if control is None:
            return OPEN
        if control.paused and (control.resumes_at is None or self.clock() < control.resumes_at):
            return PAUSED
        return LIMITED if control.limited else OPEN

    def rated(self, queue: str) -> bool:
        control = self._by_queue.get(queue)
        return control is not None and control.rated

    def next_resume(self) -> float | None:
        """When the next pause with an end ends (the claimer wakes then)."""
        ends = [c.resumes_at for c in self._by_queue.values() if c.paused and c.resumes_at is not None]
        return min(ends) if ends else None

    def resume_due(self) -> list[str]:
        """The queues whose pause has ended by now; they are paused no more here."""
        now = self.clock()
        due = [q for q, c in self._by_queue.items() if c.paused and c.resumes_at is not None and c.resumes_at <= now]
        for queue in due:
            c = self._by_queue[queue]
            self._by_queue[queue] = Control(paused=False, resumes_at=None, limited=c.limited, rated=c.rated)
        return due
