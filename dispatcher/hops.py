"""Where a new task's time goes inside a dispatcher: the moments its NOTIFY arrived, its claim
began and came back, and its assignment was written to the worker's stream.

Written as one JSON line per task sent, to the file `VALKA_DISPATCH_HOP_LOG` names (off when
empty, the default); `make bench` turns it on for its latency breakdown (bench/drain.py `hops`).
Off, each hook costs the claimer and the handler one test of None. Only tasks whose NOTIFY named
them (a task inserted on its own, as the latency workload's are) are followed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TextIO


class HopLog:
    def __init__(self, path: str) -> None:
        self._file: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 (line-buffered, open for the process's life)
        self._notified: dict[str, float] = {}
        self._claimed: dict[str, tuple[float, float, float]] = {}

    def notified(self, task_id: str) -> None:
        self._notified[task_id] = time.time()

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
