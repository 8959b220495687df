"""What a handler gets: the task's identity, its input, logging, cancellation and signals."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import Span

from valka_sdk import tracing
from valka_sdk.errors import TaskCancelled
from valka_sdk.v1 import common_pb2
from valka_sdk.v1 import worker_pb2 as pb

MAX_LOG_LINE = 64 * 1024  # characters of a line's message, cut beyond; metadata longer is left out

_LEVELS = {
    "DEBUG": common_pb2.LOG_LEVEL_DEBUG, "INFO": common_pb2.LOG_LEVEL_INFO,
    "WARN": common_pb2.LOG_LEVEL_WARN, "ERROR": common_pb2.LOG_LEVEL_ERROR,
}


@dataclass(frozen=True)
class Signal:
    """A message sent to the running task (`POST /api/v1/tasks/{id}/signal`)."""

    id: str
    type: str
    payload: Any
    sent_at_ms: int


def _json(text: str) -> Any:
    return json.loads(text) if text else None


class TaskContext:
    """Passed to every handler. Safe to use from async handlers and from sync ones (threads)."""

    def __init__(self, assignment: pb.TaskAssignment, *, emit_log: Callable[[pb.LogEntry], None],
                 loop: asyncio.AbstractEventLoop, ack_signal: Callable[[str], None]) -> None:
        self.task_id = assignment.task_id
        self.run_id = assignment.task_run_id
        self.task_name = assignment.task_name
        self.queue = assignment.queue_name
        self.attempt = assignment.attempt_number
        self.timeout_seconds = assignment.timeout_seconds
        self.input: Any = _json(assignment.input)
        self.metadata: dict[str, Any] = _json(assignment.metadata) or {}
        self._emit_log = emit_log
        self._loop = loop
        self._ack_signal = ack_signal
        self._cancelled = False  # set once, read from any thread
        self.cancel_reason = ""
        self.cancelled_by_server = False
        self._inbox: asyncio.Queue[Signal] | None = None  # made by the first signal or reader
        self._seen_signals: set[str] = set()
        self._span: Span | None = None  # the run's span (valka_sdk.tracing), set by the worker when tracing

    @property
    def _signals(self) -> asyncio.Queue[Signal]:
        if self._inbox is None:
            self._inbox = asyncio.Queue()
        return self._inbox

    # -- logging: lines are batched and streamed to the server --
    def log(self, message: str, level: str = "INFO", **metadata: Any) -> None:
        """One line of the run's log; `metadata` (JSON) is shown with it. While the run is traced the
        line carries the current span's `trace_id` and `span_id` too (the caller's own win)."""
        if self._span is not None:
            metadata = {**tracing.log_ids(self._span), **metadata}
        meta = json.dumps(metadata, default=str) if metadata else ""
        if len(meta) > MAX_LOG_LINE:
            meta = json.dumps({"truncated": True, "characters": len(meta)})
        self._emit_log(pb.LogEntry(
            task_run_id=self.run_id, timestamp_ms=int(time.time() * 1000), level=_LEVELS.get(level, 2),
            message=str(message)[:MAX_LOG_LINE], metadata=meta,
        ))

    def debug(self, message: str, **metadata: Any) -> None:
        self.log(message, "DEBUG", **metadata)

    def info(self, message: str, **metadata: Any) -> None:
        self.log(message, "INFO", **metadata)

    def warn(self, message: str, **metadata: Any) -> None:
        self.log(message, "WARN", **metadata)

    def error(self, message: str, **metadata: Any) -> None:
        self.log(message, "ERROR", **metadata)

    # -- cancellation --
    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def raise_if_cancelled(self) -> None:
        """For sync handlers: stop here if the task was cancelled."""
        if self._cancelled:
            raise TaskCancelled(self.cancel_reason or "cancelled")

    def _cancel(self, reason: str, *, by_server: bool) -> None:
        self.cancel_reason = reason
        self.cancelled_by_server = by_server
        self._cancelled = True

    # -- signals --
    def _deliver(self, signal: Signal) -> None:
        if signal.id in self._seen_signals:
            return  # delivered again after a reconnect: the handler already has it
        self._seen_signals.add(signal.id)
        self._signals.put_nowait(signal)

    def _consumed(self, signal: Signal) -> Signal:
        self._ack_signal(signal.id)
        return signal

    async def signals(self) -> AsyncIterator[Signal]:
        """Incoming signals, in the order they were sent; each is acknowledged as it is taken."""
        while True:
            yield self._consumed(await self._signals.get())

    async def wait_for_signal(self, signal_type: str | None = None, timeout: float | None = None) -> Signal | None:
        """The next signal (of `signal_type`, if given), or None after `timeout` seconds.

        Signals of other types that arrive meanwhile are acknowledged and passed over.
        """
        deadline = None if timeout is None else self._loop.time() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - self._loop.time())
            try:
                signal = await asyncio.wait_for(self._signals.get(), remaining)
            except TimeoutError:
                return None
            self._consumed(signal)
            if signal_type is None or signal.type == signal_type:
                return signal

    def poll_signal(self) -> Signal | None:
        """For sync handlers: the next waiting signal, or None (acknowledged when returned)."""
        holder: list[Signal | None] = []
        done = threading.Event()

        def take() -> None:
            try:
                holder.append(self._consumed(self._signals.get_nowait()))
            except asyncio.QueueEmpty:
                holder.append(None)
            done.set()

        self._loop.call_soon_threadsafe(take)
        done.wait(5)
        return holder[0] if holder else None
