"""A dispatcher node: its workers' sessions and the loops that serve them.

Every dispatcher serves only its own connected workers; several nodes share
one database and never hand one task to two workers, because a task is
claimed with FOR UPDATE SKIP LOCKED and moved by guarded updates only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field

from dispatcher import sql
from dispatcher.claimer import Claimer
from dispatcher.db import conninfo, make_pool
from dispatcher.flusher import Flusher, LogLine, Result, valid_uuid
from dispatcher.session import WorkerSession
from dispatcher.signals import SignalRelay
from tasks.errors import ValkaError
from tasks.live import Fanout
from tasks.notify import SIGNAL_SENT, TASK_CANCELLED, TASK_READY
from tasks.retry import RetryPolicy
from tasks.specs import check_json
from tasks.sql import outcomes
from valka.conf import valka_settings
from valka.listen import Listener
from valka.v1 import common_pb2
from valka.v1 import worker_pb2 as pb

log = logging.getLogger("valka.dispatcher")

LEVELS = {
    common_pb2.LOG_LEVEL_DEBUG: "DEBUG", common_pb2.LOG_LEVEL_INFO: "INFO",
    common_pb2.LOG_LEVEL_WARN: "WARN", common_pb2.LOG_LEVEL_ERROR: "ERROR",
}
MAX_LOG_MESSAGE = 64 * 1024
MAX_OUTPUT = 16 * 1024 * 1024


@dataclass
class NodeSettings:
    node_id: str
    lease_extension: float
    poll_interval: float
    drain_seconds: int
    worker_token: str
    keepalive_interval: float = 10.0
    retry_params: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_settings(cls) -> NodeSettings:
        node_id = valka_settings.NODE_ID or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        return cls(
            node_id=node_id,
            lease_extension=float(valka_settings.LEASE_EXTENSION),
            poll_interval=float(valka_settings.DISPATCH_POLL_INTERVAL),
            drain_seconds=int(valka_settings.DRAIN_SECONDS),
            worker_token=valka_settings.WORKER_TOKEN,
            retry_params=RetryPolicy.from_settings().sql_params(),
        )


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _storable_float(literal: str) -> float:
    """A JSON number jsonb takes: finite, with an exponent and length far inside numeric's range."""
    value = float(literal)
    exponent = literal.lower().partition("e")[2]
    if not math.isfinite(value) or len(literal) > 1000 or (exponent and abs(int(exponent)) > 1000):
        raise ValueError(f"number {literal[:40]} is out of range")
    return value


def json_or_none(text: str) -> str | None:
    """`text` if it is JSON PostgreSQL can store under the producers' rules (tasks.specs.check_json:
    no NaN, NUL or lone surrogates, at most MAX_JSON_DEPTH levels), else None. A value PostgreSQL
    refused would fail the writer's whole batch, so it must not get that far."""
    if not text:
        return None
    try:
        check_json("output", json.loads(text, parse_constant=_refuse_constant, parse_float=_storable_float),
                   sys.maxsize)
    except (ValueError, RecursionError, ValkaError):
        return None
    return text


class DispatcherNode:
    def __init__(self, settings: NodeSettings | None = None) -> None:
        self.settings = settings or NodeSettings.from_settings()
        self.pool = make_pool(f"valka-dispatcher {self.settings.node_id}", min_size=2, max_size=6,
                              session=sql.WRITER_SESSION)
        # Claims run on connections of their own, set up for that one statement (sql.CLAIM_SESSION).
        self.claim_pool = make_pool(f"valka-dispatcher-claim {self.settings.node_id}", min_size=1, max_size=2,
                                    session=sql.CLAIM_SESSION)
        self.sessions: dict[str, WorkerSession] = {}  # by worker id
        self.claimer = Claimer(self)
        # Task events and log wake-ups for ApiService subscribers, on a LISTEN connection of their own
        # opened by the first subscriber: most nodes never serve one.
        self.fanout = Fanout(conninfo(application_name=f"valka-dispatcher-events {self.settings.node_id}"))
        self.flusher = Flusher(self)
        self.listener = Listener(
            conninfo(application_name=f"valka-dispatcher-listen {self.settings.node_id}"),
            {TASK_READY: self.claimer.wake, TASK_CANCELLED: self._on_cancel_notify, SIGNAL_SENT: self._on_signal},
            on_reconnect=lambda: self.claimer.wake(None),
        )
        self.stopping = False
        self._stop = asyncio.Event()
        self._flusher_stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.open_streams = 0  # stream handlers still running (their cleanup included)
        self.signal_handler = SignalRelay(self)

    # -- lifecycle --
    async def start(self) -> None:
        await self.pool.open(wait=False)
        await self.claim_pool.open(wait=False)
        self._tasks = [
            asyncio.create_task(self.claimer.run(self._stop), name="claimer"),
            asyncio.create_task(self.flusher.run(self._flusher_stop), name="flusher"),
            asyncio.create_task(self.listener.run(self._stop), name="listener"),
            asyncio.create_task(self._keepalive(), name="keepalive"),
        ]

    async def stop(self, drain_seconds: float | None = None) -> None:
        """Stop claiming, ask workers to drain, wait for their results, then close."""
        drain = self.settings.drain_seconds if drain_seconds is None else drain_seconds
        self.stopping = True
        for session in list(self.sessions.values()):
            session.draining = True
            session.send(pb.WorkerResponse(server_shutdown=pb.ServerShutdown(
                reason="dispatcher shutting down", drain_seconds=int(drain))))
        deadline = time.monotonic() + drain
        while time.monotonic() < deadline and any(s.in_flight for s in self.sessions.values()):
            await asyncio.sleep(0.05)
        self._stop.set()
        for session in list(self.sessions.values()):
            session.close()
        # Let the stream handlers run their cleanup, then write what is left.
        await asyncio.sleep(0)
        for _ in range(200):
            if not self.open_streams:
                break
            await asyncio.sleep(0.05)
        self._flusher_stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.fanout.close()
        await self.claim_pool.close()
        await self.pool.close()

    async def _keepalive(self) -> None:
        """Refresh `workers.last_heartbeat_at` for every session of this node, so the
        scheduler's worker janitor only reaps workers whose dispatcher is gone."""
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), self.settings.keepalive_interval)
                return
            except TimeoutError:
                pass
            ids = list(self.sessions)
            if not ids:
                continue
            try:
                async with self.pool.connection() as conn:
                    await conn.execute(sql.TOUCH_WORKERS, {"worker_ids": ids, "node_id": self.settings.node_id})
            except Exception as exc:
                log.warning("dispatcher: keepalive write failed: %s", exc)

    # -- queries from the loops --
    def served_queues(self) -> set[str]:
        return {q for s in self.sessions.values() if s.free_slots() > 0 for q in s.queues}

    def sessions_for(self, queue: str) -> list[WorkerSession]:
        return [s for s in self.sessions.values() if queue in s.queues and not s.closed]

    # -- session events --
    async def open_session(self, hello: pb.WorkerHello) -> WorkerSession:
        worker_id = hello.worker_id or str(uuid.uuid4())
        session = WorkerSession(
            worker_id=worker_id, name=hello.worker_name or worker_id, queues=tuple(dict.fromkeys(hello.queues)),
            concurrency=max(1, hello.concurrency or 1), session_id=uuid.uuid4().hex,
            metadata=json_or_none(hello.metadata) or "{}",
        )
        previous = self.sessions.pop(worker_id, None)
        if previous is not None:
            # Its stream handler notices, stops writing, and releases what it held.
            log.info("dispatcher: worker %s reconnected; replacing its previous session", worker_id)
            previous.close()
        async with self.pool.connection() as conn, conn.transaction():
            # Whatever an earlier session of this worker still held (here or on a node that died) is lost.
            await outcomes.lose_worker_runs(conn, worker_id, "worker disconnected", self.settings.retry_params)
            await conn.execute(sql.UPSERT_WORKER, {
                "id": worker_id, "name": session.name, "queues": list(session.queues),
                "concurrency": session.concurrency, "node_id": self.settings.node_id,
                "session_id": session.session_id, "metadata": session.metadata,
            })
        self.sessions[worker_id] = session
        log.info("dispatcher: worker %s (%s) connected: queues=%s concurrency=%d", worker_id, session.name,
                 ",".join(session.queues), session.concurrency)
        for queue in session.queues:
            self.claimer.wake(queue)
        return session

    async def close_session(self, session: WorkerSession, reason: str = "worker disconnected") -> None:
        """The stream ended and its writer has stopped: unsent tasks go back to PENDING,
        running ones are lost (retried now, or dead-lettered)."""
        if self.sessions.get(session.worker_id) is session:
            del self.sessions[session.worker_id]
        session.close()
        entries = list(session.in_flight.values())
        session.in_flight.clear()
        session.by_run.clear()
        unsent = [e.task_id for e in entries if not e.sent]
        sent = [e for e in entries if e.sent]
        # A start still on its way must land before its run can be closed as lost.
        for entry in sent:
            try:
                await asyncio.wait_for(asyncio.shield(entry.started), 10)
            except TimeoutError:
                pass
        started_runs = [e.run_id for e in sent if e.started.done() and e.started.result()]
        for attempt in range(20):
            try:
                async with self.pool.connection() as conn, conn.transaction():
                    if unsent:
                        await conn.execute(sql.UNSEND, {"task_ids": unsent, "node_id": self.settings.node_id})
                    if started_runs:
                        await outcomes.retry_runs(
                            conn, started_runs, [session.worker_id] * len(started_runs),
                            ["worker disconnected"] * len(started_runs), lost=True,
                            retry_params=self.settings.retry_params)
                    await conn.execute(sql.DISCONNECT_WORKER, {"id": session.worker_id,
                                                               "session_id": session.session_id})
                break
            except Exception as exc:
                # The scheduler's reaper and janitor recover these if we never get through.
                log.warning("dispatcher: recording the disconnect of %s failed (%s); retry %d",
                            session.worker_id, exc, attempt + 1)
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
        log.info("dispatcher: worker %s disconnected (%s): %d unsent, %d running tasks released",
                 session.worker_id, reason, len(unsent), len(started_runs))
        for queue in session.queues:
            self.claimer.wake(queue)

    def on_sent(self, session: WorkerSession, entry) -> None:
        entry.sent = True
        self.flusher.start(entry, session.worker_id)

    def on_result(self, session: WorkerSession, result: pb.TaskResult) -> str | None:
        """Take a worker's result; returns a complaint for a result we could not use."""
        entry = session.release(result.task_run_id)
        if entry is not None:  # a run id this node made: no need to check its form
            self.claimer.freed(entry.queue)
        elif not valid_uuid(result.task_run_id):
            return f"task_result: task_run_id {result.task_run_id!r} is not a run id"
        if result.success:
            output = json_or_none(result.output) if result.output else None
            if result.output and output is None:
                self.flusher.result(Result(result.task_run_id, session.worker_id, False, False,
                                           "the worker returned an output that is not valid JSON or not storable "
                                           "(NaN, NUL, lone surrogates, nesting over 100 levels)", entry))
                return None
            if output is not None and len(output) > MAX_OUTPUT:
                self.flusher.result(Result(result.task_run_id, session.worker_id, False, False,
                                           "the worker returned an output over the size limit", entry))
                return None
            self.flusher.result(Result(result.task_run_id, session.worker_id, True, False, output, entry))
        else:
            error = (result.error_message or "failed").replace("\x00", "")[:MAX_LOG_MESSAGE]
            self.flusher.result(Result(result.task_run_id, session.worker_id, False, result.retryable, error, entry))
        if entry is None:
            log.debug("dispatcher: result for run %s not held by this session of %s", result.task_run_id,
                      session.worker_id)
        return None

    def on_heartbeat(self, session: WorkerSession, beat: pb.Heartbeat) -> None:
        self.flusher.heartbeat(session.worker_id, [t for t in beat.active_task_ids if valid_uuid(t)])
        session.send(pb.WorkerResponse(heartbeat_ack=pb.HeartbeatAck(server_timestamp_ms=int(time.time() * 1000))))

    def on_logs(self, session: WorkerSession, batch: pb.LogBatch) -> None:
        lines = []
        now_ms = int(time.time() * 1000)
        for e in batch.entries:
            # Only lines of runs this session holds: a worker cannot write into another's run.
            if e.task_run_id not in session.by_run:
                continue
            lines.append(LogLine(
                run_id=e.task_run_id,
                ts_ms=e.timestamp_ms if 0 < e.timestamp_ms < 253402300799000 else now_ms,
                level=LEVELS.get(e.level, "INFO"),
                message=e.message.replace("\x00", "")[:MAX_LOG_MESSAGE],
                metadata=json_or_none(e.metadata),
                gate=session.by_run.get(e.task_run_id),
            ))
        if lines:
            self.flusher.logs(lines)

    def on_shutdown(self, session: WorkerSession) -> None:
        session.draining = True
        log.info("dispatcher: worker %s is draining", session.worker_id)

    # -- notifications --
    def _on_cancel_notify(self, task_id: str) -> None:
        self.cancel_on_worker(task_id, "task cancelled")

    def cancel_on_worker(self, task_id: str, reason: str) -> None:
        for session in self.sessions.values():
            entry = session.in_flight.get(task_id)
            if entry is not None and not entry.cancel_sent:
                entry.cancel_sent = True
                session.send(pb.WorkerResponse(task_cancellation=pb.TaskCancellation(task_id=task_id, reason=reason)))

    def _on_signal(self, task_id: str) -> None:
        self.signal_handler.on_notify(task_id)

    def unsend(self, task_ids: list[str]) -> None:
        async def _write() -> None:
            async with self.pool.connection() as conn:
                await conn.execute(sql.UNSEND, {"task_ids": task_ids, "node_id": self.settings.node_id})
        asyncio.get_running_loop().create_task(_write())
