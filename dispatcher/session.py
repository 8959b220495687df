"""A worker's stream as the dispatcher sees it (who it is, its free slots, its outbox), and the
registry of this node's sessions. In memory only, touched by the event loop's thread alone."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from valka_sdk.v1 import worker_pb2 as pb

log = logging.getLogger("valka.dispatcher")


@dataclass(eq=False)
class InFlight:
    """A task handed to (or being handed to) this worker."""

    task_id: str
    run_id: str
    queue: str
    attempt: int
    sent: bool = False
    cancel_sent: bool = False
    # Its result came back on a held queue: it keeps its slot until the writer has written its end
    # (dispatcher.handler.SessionHandler.results_written).
    ended: bool = False
    # Resolved by the writer once DISPATCHING → RUNNING is committed (True) or lost its race (False).
    started: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    assigned_at: float = field(default_factory=time.monotonic)
    # The run's log so far, against its limits (dispatcher.handler.SessionHandler.on_logs).
    log_lines: int = 0
    log_bytes: int = 0
    dropped_lines: int = 0
    dropped_bytes: int = 0


@dataclass(eq=False)
class Outgoing:
    message: pb.WorkerResponse
    in_flight: InFlight | None = None


CLOSE = object()
OUTBOX_LIMIT = 10_000  # messages waiting for one worker


@dataclass(eq=False)
class WorkerSession:
    worker_id: str
    name: str
    queues: tuple[str, ...]
    concurrency: int
    session_id: str
    metadata: str = "{}"
    instance: str | None = None  # the worker process's own id, when its hello says it (valka.instance)
    draining: bool = False
    closed: bool = False
    outbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    in_flight: dict[str, InFlight] = field(default_factory=dict)  # by task id
    by_run: dict[str, InFlight] = field(default_factory=dict)  # by run id
    # The task ids of runs carried over from the worker's previous session, until its first
    # heartbeat says which it still runs (dispatcher.handler.SessionHandler.on_heartbeat).
    carried: set[str] | None = None

    def free_slots(self) -> int:
        if self.draining or self.closed:
            return 0
        return max(0, self.concurrency - len(self.in_flight))

    def reserve(self, entry: InFlight) -> None:
        self.in_flight[entry.task_id] = entry
        self.by_run[entry.run_id] = entry

    def adopt(self, entry: InFlight) -> None:
        """Take a run over from the worker's previous session: sent, and started long since."""
        entry.sent = True
        if not entry.started.done():
            entry.started.set_result(True)
        self.reserve(entry)
        self.carried = (self.carried or set()) | {entry.task_id}

    def release(self, run_id: str) -> InFlight | None:
        entry = self.by_run.pop(run_id, None)
        if entry is not None and self.in_flight.get(entry.task_id) is entry:
            del self.in_flight[entry.task_id]
        return entry

    def send(self, message: pb.WorkerResponse, in_flight: InFlight | None = None) -> None:
        """Queue `message` for the worker. A worker that lets OUTBOX_LIMIT messages pile up is
        not reading: its session is closed rather than left to grow."""
        if self.closed:
            return
        if self.outbox.qsize() >= OUTBOX_LIMIT:
            log.warning("dispatcher: worker %s reads nothing (%d messages waiting); closing its session",
                        self.worker_id, self.outbox.qsize())
            self.close()
            return
        self.outbox.put_nowait(Outgoing(message, in_flight))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.outbox.put_nowait(CLOSE)


class SessionRegistry:
    """This node's worker sessions, by worker id: the only workers this node can hand tasks to."""

    def __init__(self) -> None:
        self._by_worker: dict[str, WorkerSession] = {}

    def __iter__(self) -> Iterator[WorkerSession]:
        return iter(list(self._by_worker.values()))  # a snapshot: sessions come and go while one iterates

    def __len__(self) -> int:
        return len(self._by_worker)

    def worker_ids(self) -> list[str]:
        return list(self._by_worker)

    def get(self, worker_id: str) -> WorkerSession | None:
        return self._by_worker.get(worker_id)

    def add(self, session: WorkerSession) -> None:
        self._by_worker[session.worker_id] = session

    def pop(self, worker_id: str) -> WorkerSession | None:
        return self._by_worker.pop(worker_id, None)

    def discard(self, session: WorkerSession) -> None:
        """Forget `session` if it is still its worker's current one (a reconnect replaced it otherwise)."""
        if self._by_worker.get(session.worker_id) is session:
            del self._by_worker[session.worker_id]

    def served_queues(self) -> set[str]:
        """The queues some session has a free slot for."""
        return {q for s in self._by_worker.values() if s.free_slots() > 0 for q in s.queues}

    def for_queue(self, queue: str) -> list[WorkerSession]:
        return [s for s in self._by_worker.values() if queue in s.queues and not s.closed]

    def in_flight(self, task_id: str) -> InFlight | None:
        """The assignment of `task_id` on this node, if a session holds it."""
        for session in self._by_worker.values():
            entry = session.in_flight.get(task_id)
            if entry is not None:
                return entry
        return None

    def holder(self, task_id: str) -> WorkerSession | None:
        """The open session that holds `task_id`, if any."""
        for session in self._by_worker.values():
            if task_id in session.in_flight and not session.closed:
                return session
        return None
