"""What the node does with a worker's session: open it, take its messages, close it.

The gRPC stream handler (worker_service) calls in here; this module decides, with the
parts it is given: the session registry, the writer (everything reported is written in
batches) and the claimer (woken by new workers and freed slots). Opening and closing a
session are written at once, each in one transaction of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from psycopg_pool import AsyncConnectionPool

from dispatcher import protocol, sql
from dispatcher.claimer import Claimer
from dispatcher.retries import write_retried
from dispatcher.session import InFlight, SessionRegistry, WorkerSession
from dispatcher.writer import Writer
from tasks.sql import outcomes
from valka_sdk.v1 import worker_pb2 as pb

log = logging.getLogger("valka.dispatcher")

CLOSE_ATTEMPTS = 20  # tries to record a disconnect before leaving it to the scheduler


@dataclass(frozen=True)
class HandlerSettings:
    node_id: str  # written into workers.node_id
    retry_params: dict[str, float] = field(default_factory=dict)  # for the runs a closed session leaves
    run_log_max_lines: int = 10_000  # a run's log lines kept; later ones are counted and dropped
    run_log_max_bytes: int = 10 * 1024 * 1024  # and bytes of their messages and metadata
    # Queues whose results free their slots once their ends are written (`results_written`), not
    # as they come back: the constraint of a max_running at the workers' slots with no count, which
    # `make bench` measures as the capped drain's bound (settings DISPATCH_HELD_QUEUES).
    held_queues: frozenset[str] = frozenset()


class WorkerIdTaken(Exception):
    """A hello for a worker id that another live process holds (answered ALREADY_EXISTS)."""


def _another(holder: str | None, newcomer: str | None) -> bool:
    """Whether two hellos come from different processes: only when both say which they are
    (a worker of another SDK, which does not, is let in as a reconnect, as it always was)."""
    return bool(holder and newcomer and holder != newcomer)


class SessionHandler:
    def __init__(self, *, pool: AsyncConnectionPool, sessions: SessionRegistry, writer: Writer, claimer: Claimer,
                 settings: HandlerSettings) -> None:
        self.pool = pool
        self.sessions = sessions
        self.writer = writer
        self.claimer = claimer
        self.settings = settings
        self.accepting = True  # False once the node stops: new streams are refused
        self.handing_over = False  # True once the node stops: a closing session keeps its runs RUNNING
        self.open_streams = 0  # stream handlers still running (their cleanup included)

    async def open_session(self, hello: pb.WorkerHello) -> WorkerSession:
        """Record the worker CONNECTED to this node.

        The same process coming back (its hello names the process instance its row names) keeps
        the runs it still holds: a dispatcher that stopped handed them over rather than losing
        them, and they carry on in this session (its first heartbeat says which it still runs).
        Otherwise whatever an earlier session of the worker id held (here, or on a node that
        died) is lost, in the same transaction.

        A hello from another process than the one whose session holds the worker id (both say
        which they are) is refused with WorkerIdTaken while that session is alive: open here,
        or CONNECTED on a node whose LISTEN connection is open. Two replicas given one id would
        otherwise close each other's runs at every reconnect."""
        worker_id = hello.worker_id or str(uuid.uuid4())
        metadata = protocol.json_or_none(hello.metadata) or "{}"
        session = WorkerSession(
            worker_id=worker_id, name=hello.worker_name or worker_id, queues=tuple(dict.fromkeys(hello.queues)),
            concurrency=max(1, hello.concurrency or 1), session_id=uuid.uuid4().hex,
            metadata=metadata, instance=protocol.instance_of(metadata),
        )
        previous = self.sessions.get(worker_id)
        if previous is not None and not previous.closed and _another(previous.instance, session.instance):
            raise WorkerIdTaken(f"worker id {worker_id!r} is held by another connected worker process; "
                                "give each worker process an id of its own")
        async with self.pool.connection() as conn, conn.transaction():
            row = await (await conn.execute(sql.WORKER_ROW, {
                "id": worker_id, "instance_key": protocol.INSTANCE_KEY})).fetchone()
            status, node_id, instance, node_alive = row if row is not None else (None, None, None, False)
            if (status == "CONNECTED" and node_id != self.settings.node_id and node_alive
                    and _another(instance, session.instance)):
                raise WorkerIdTaken(f"worker id {worker_id!r} is held by another worker process, connected "
                                    f"to dispatcher {node_id}; give each worker process an id of its own")
            previous = self.sessions.pop(worker_id)
            if previous is not None:
                # Its stream handler notices, stops writing, and releases what it held.
                log.info("dispatcher: worker %s reconnected; replacing its previous session", worker_id)
                previous.close()
            if session.instance is not None and instance == session.instance:
                adopted = await (await conn.execute(sql.RUNS_TO_ADOPT, {"worker_id": worker_id})).fetchall()
            else:
                adopted = []
                await outcomes.lose_worker_runs(conn, worker_id, "worker disconnected", self.settings.retry_params)
            await conn.execute(sql.UPSERT_WORKER, {
                "id": worker_id, "name": session.name, "queues": list(session.queues),
                "concurrency": session.concurrency, "node_id": self.settings.node_id,
                "session_id": session.session_id, "metadata": session.metadata,
            })
            await conn.execute(sql.ENSURE_QUEUES, {"queues": list(session.queues)})
        for run_id, task_id, queue, attempt in adopted:
            session.adopt(InFlight(task_id=task_id, run_id=run_id, queue=queue, attempt=attempt, sent=True))
        self.sessions.add(session)
        log.info("dispatcher: worker %s (%s) connected: queues=%s concurrency=%d%s", worker_id, session.name,
                 ",".join(session.queues), session.concurrency,
                 f"; {len(adopted)} running tasks carried over" if adopted else "")
        for queue in session.queues:
            self.claimer.wake(queue)
        return session

    async def close_session(self, session: WorkerSession, reason: str = "worker disconnected") -> None:
        """The stream ended and its writer has stopped: unsent tasks go back to PENDING, running
        ones are lost (retried now, or dead-lettered) or, while this node stops, handed over:
        left RUNNING for the session the worker opens on another dispatcher (their leases, which
        its heartbeats keep, bound how long they wait for it)."""
        self.sessions.discard(session)
        session.close()
        # A held run whose result came back is the writer's to end, not lost.
        entries = [e for e in session.in_flight.values() if not e.ended]
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
        lost = [] if self.handing_over else started_runs
        async def record(conn: Any) -> None:
            async with conn.transaction():
                if unsent:
                    await conn.execute(sql.UNSEND, {"task_ids": unsent, "node_id": self.settings.node_id})
                if lost:
                    await outcomes.retry_runs(
                        conn, lost, [session.worker_id] * len(lost), ["worker disconnected"] * len(lost),
                        lost=True, retry_params=self.settings.retry_params)
                await conn.execute(sql.DISCONNECT_WORKER, {"id": session.worker_id,
                                                           "session_id": session.session_id})

        await write_retried(self.pool, record, attempts=CLOSE_ATTEMPTS,
                            what=f"recording the disconnect of {session.worker_id}")
        log.info("dispatcher: worker %s disconnected (%s): %d unsent, %d running tasks %s",
                 session.worker_id, reason, len(unsent), len(started_runs),
                 "handed over" if self.handing_over else "released")
        for queue in session.queues:
            self.claimer.wake(queue)

    async def wait_for_room(self) -> None:
        """Before a stream reads its next message: while the writer's buffer is full, reading
        waits, and gRPC's flow control holds the worker back."""
        if not self.writer.room.is_set():
            await self.writer.room.wait()

    # -- the worker's messages --
    def on_sent(self, session: WorkerSession, entry: InFlight) -> None:
        """An assignment left for the worker: its start goes to the writer."""
        entry.sent = True
        self.writer.start(entry, session.worker_id)
        if self.claimer.hops is not None:
            self.claimer.hops.sent(entry.task_id)

    def on_result(self, session: WorkerSession, result: pb.TaskResult) -> str | None:
        """Take a worker's result; returns a complaint for a result we could not use."""
        entry = session.release(result.task_run_id)
        if entry is not None:  # a run id this node made: no need to check its form
            if entry.queue in self.settings.held_queues:
                entry.ended = True
                session.reserve(entry)  # its slot frees once the end is written (results_written)
            else:
                self.claimer.freed(entry.queue)
            if entry.dropped_lines:
                self.writer.logs([self._truncation_line(entry)])
        elif not protocol.valid_uuid(result.task_run_id):
            return f"task_result: task_run_id {result.task_run_id!r} is not a run id"
        self.writer.result(protocol.result_from(result, session.worker_id, entry))
        if entry is None:
            log.debug("dispatcher: result for run %s not held by this session of %s", result.task_run_id,
                      session.worker_id)
        return None

    def results_written(self, results: list[protocol.Result]) -> None:
        """The writer committed these results' ends: the slots of held queues' runs free now."""
        for result in results:
            entry = result.gate
            if entry is None or not entry.ended:
                continue
            session = self.sessions.get(result.worker_id)
            # Only the session that held it back: a reconnect may have carried the run into a new one.
            if session is not None and session.by_run.get(entry.run_id) is entry:
                session.release(entry.run_id)
                self.claimer.slot_freed(entry.queue)

    def on_heartbeat(self, session: WorkerSession, beat: pb.Heartbeat) -> None:
        """Extend the leases of the runs the worker says it holds (only those it really holds are;
        runs the cluster closed behind its back are the sweep's to stop).

        The first heartbeat of a session that carried runs over settles them: a carried run the
        worker does not name is let go (its slot freed; if the worker really lost it, the lease
        reaper closes it, as it may as well have ended on the stream that closed), and a task it
        names that was not carried over is not its to run any more: it is told to stop."""
        # A worker holds at most its concurrency (or what it was given): more ids are not its own.
        named = beat.active_task_ids[:max(session.concurrency, len(session.in_flight))]
        held = [t for t in named if protocol.valid_uuid(t)]
        self.writer.heartbeat(session.worker_id, session.session_id, held)
        session.send(protocol.heartbeat_ack())
        if session.carried is not None:
            carried, session.carried = session.carried, None
            for task_id in carried - set(held):
                entry = session.in_flight.get(task_id)
                if entry is not None and session.release(entry.run_id) is not None:
                    self.claimer.freed(entry.queue)
            for task_id in set(held) - carried:
                if task_id not in session.in_flight:
                    session.send(protocol.cancellation(task_id, "this task is no longer this worker's to run"))

    def on_logs(self, session: WorkerSession, batch: pb.LogBatch) -> None:
        """Keep a run's lines up to its limits (lines and bytes); past them, count what is dropped,
        for one line that says so when the run ends."""
        max_lines, max_bytes = self.settings.run_log_max_lines, self.settings.run_log_max_bytes
        kept = []
        for line in protocol.log_lines(batch, session.by_run):
            run = line.gate
            assert run is not None  # log_lines keeps only the lines of runs the session holds
            size = len(line.message.encode()) + len(line.metadata or "")
            if run.log_lines >= max_lines or run.log_bytes + size > max_bytes:
                run.dropped_lines += 1
                run.dropped_bytes += size
                continue
            run.log_lines += 1
            run.log_bytes += size
            kept.append(line)
        if kept:
            self.writer.logs(kept)

    def _truncation_line(self, run: InFlight) -> protocol.LogLine:
        return protocol.LogLine(
            run_id=run.run_id, ts_ms=int(time.time() * 1000), level="WARN",
            message=(f"log truncated: {run.dropped_lines} more lines ({run.dropped_bytes} bytes) were dropped, "
                     f"over the limit of {self.settings.run_log_max_lines} lines or "
                     f"{self.settings.run_log_max_bytes} bytes per run"),
            metadata=json.dumps({"dropped_lines": run.dropped_lines, "dropped_bytes": run.dropped_bytes}),
            gate=None)

    def on_signal_ack(self, session: WorkerSession, signal_id: str) -> None:
        if protocol.valid_uuid(signal_id):
            self.writer.ack(session.worker_id, signal_id)

    def on_shutdown(self, session: WorkerSession) -> None:
        session.draining = True
        log.info("dispatcher: worker %s is draining", session.worker_id)
