"""Where a new task's time goes inside a dispatcher: the moments its NOTIFY arrived, its claim
began and came back, and its assignment was written to the worker's stream.

Written as one JSON line per task sent, to the file `VALKA_DISPATCH_HOP_LOG` names (off when
empty, the default); `make bench` turns it on for its latency breakdown (bench/drain.py `hops`).
Off, each hook costs the claimer and the handler one test of None. Only tasks whose NOTIFY named
them (a task inserted on its own) have a NOTIFY moment; the others' is null.
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
        self._claimed: dict[str, tuple[float | None, float, float]] = {}

    def notified(self, task_id: str) -> None:
        self._notified[task_id] = time.time()

    def claimed(self, task_ids: Iterable[str], began: float) -> None:
        """`task_ids` came back from a claim that began at `began` (time.time())."""
        ended = time.time()
        for task_id in task_ids:
            self._claimed[task_id] = (self._notified.pop(task_id, None), began, ended)

    def sent(self, task_id: str) -> None:
        stamps = self._claimed.pop(task_id, None)
        if stamps is not None:
            notified, began, ended = stamps
            self._file.write(json.dumps({"task_id": task_id, "notified": notified, "claim_began": began,
                                         "claim_ended": ended, "sent": time.time()}) + "\n")
