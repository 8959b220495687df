"""One worker's stream as the dispatcher sees it: who it is, its free slots, its outbox."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from valka.v1 import worker_pb2 as pb


@dataclass(eq=False)
class InFlight:
    """A task handed to (or being handed to) this worker."""

    task_id: str
    run_id: str
    queue: str
    attempt: int
    sent: bool = False
    cancel_sent: bool = False
    # Resolved by the flusher once DISPATCHING → RUNNING is committed (True) or lost its race (False).
    started: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    assigned_at: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class Outgoing:
    message: pb.WorkerResponse
    in_flight: InFlight | None = None


CLOSE = object()


@dataclass(eq=False)
class WorkerSession:
    worker_id: str
    name: str
    queues: tuple[str, ...]
    concurrency: int
    session_id: str
    metadata: str = "{}"
    draining: bool = False
    closed: bool = False
    outbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    in_flight: dict[str, InFlight] = field(default_factory=dict)  # by task id
    by_run: dict[str, InFlight] = field(default_factory=dict)  # by run id

    def free_slots(self) -> int:
        if self.draining or self.closed:
            return 0
        return max(0, self.concurrency - len(self.in_flight))

    def reserve(self, entry: InFlight) -> None:
        self.in_flight[entry.task_id] = entry
        self.by_run[entry.run_id] = entry

    def release(self, run_id: str) -> InFlight | None:
        entry = self.by_run.pop(run_id, None)
        if entry is not None and self.in_flight.get(entry.task_id) is entry:
            del self.in_flight[entry.task_id]
        return entry

    def send(self, message: pb.WorkerResponse, in_flight: InFlight | None = None) -> None:
        if not self.closed:
            self.outbox.put_nowait(Outgoing(message, in_flight))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.outbox.put_nowait(CLOSE)
