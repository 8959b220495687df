"""Where a new task's time goes inside a dispatcher: the moments its NOTIFY arrived, its claim
began and came back, and its assignment was written to the worker's stream.

Written as one JSON line per task sent, to the file `VALKA_DISPATCH_HOP_LOG` names (off when
empty, the default); `make bench` turns it on for its latency breakdown (bench/drain.py `hops`).
Off, each hook costs the claimer and the handler one test of None. Only tasks whose NOTIFY named
them (a task inserted on its own, as the latency workload's are) are followed. A task followed
that never reaches the next hop here (another node claimed it, it was put back) is forgotten
after `STALE` seconds, so that the log neither grows nor makes a drain's claims look up its ids.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TextIO

STALE = 10.0  # seconds a followed task may wait for its next hop before it is forgotten


class HopLog:
    def __init__(self, path: str) -> None:
        self._file: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 (line-buffered, open for the process's life)
        self._notified: dict[str, float] = {}
        self._claimed: dict[str, tuple[float, float, float]] = {}
        self._pruned = time.time()

    def notified(self, task_id: str) -> None:
        now = time.time()
        self._notified[task_id] = now
        if now - self._pruned > STALE:
            self._prune(now)

    def _prune(self, now: float) -> None:
        """Forget the tasks that waited longer than STALE for their next hop here."""
        self._pruned = now
        self._notified = {t: at for t, at in self._notified.items() if now - at <= STALE}
        self._claimed = {t: stamps for t, stamps in self._claimed.items() if now - stamps[2] <= STALE}

    def claimed(self, task_ids: Iterable[str], began: float) -> None:
        """`task_ids` came back from a claim that began at `began` (time.time()). Only the tasks
        a NOTIFY named are followed: a drain's thousands are not, so the log costs it nothing."""
        if not self._notified:
            return
        ended = time.time()
        for task_id in task_ids:
            notified = self._notified.pop(task_id, None)
            if notified is not None:
                self._claimed[task_id] = (notified, began, ended)

    def sent(self, task_id: str) -> None:
        if not self._claimed:
            return
        stamps = self._claimed.pop(task_id, None)
        if stamps is not None:
            notified, began, ended = stamps
            self._file.write(json.dumps({"task_id": task_id, "notified": notified, "claim_began": began,
                                         "claim_ended": ended, "sent": time.time()}) + "\n")
