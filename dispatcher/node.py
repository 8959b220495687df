"""A dispatcher node: builds its parts, wires them together, and runs them (start, stop, drain).

Every dispatcher serves only its own connected workers; several nodes share
one database and never hand one task to two workers, because a task is
claimed with FOR UPDATE SKIP LOCKED and moved by guarded updates only.

The parts, each built from what it uses (see docs/architecture.md):
- `sessions`: the worker sessions of this node (dispatcher.session);
- `claimer`: hands due tasks to sessions with free slots, on pools of its own (dispatcher.claimer),
  as the queues' controls allow (dispatcher.controls);
- `writer`: writes starts, results, heartbeats and logs in batches (dispatcher.writer);
- `relay`: signals and cancellations to the workers holding their tasks (dispatcher.relay);
- `handler`: opens and closes sessions and takes their messages (dispatcher.handler);
- `keepalive`: tells the scheduler this node's workers are alive (dispatcher.keepalive);
- `sweep`: looks at the rows for what a lost notification would have said (dispatcher.sweep);
- a LISTEN connection that wakes the claimer and the relay, and the `fanout` of task events
  and log wake-ups for ApiService subscribers.

Both pools and the LISTEN connections keep sessions of their own (VALKA_DIRECT_DATABASE_URL
when DATABASE_URL leads through a transaction pooler): the pools plan with session settings.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

from dispatcher import protocol, sql
from dispatcher.claimer import Claimer, ClaimerSettings
from dispatcher.controls import QueueControls
from dispatcher.handler import HandlerSettings, SessionHandler
from dispatcher.hops import HopLog
from dispatcher.keepalive import Keepalive
from dispatcher.offers import Offers
from dispatcher.relay import Relay
from dispatcher.session import SessionRegistry
from dispatcher.sweep import Sweep
from dispatcher.writer import Writer, WriterSettings
from tasks.live import Fanout
from tasks.notify import QUEUE_CHANGED, QUEUE_SLOT_FREED, SIGNAL_SENT, TASK_CANCELLED, TASK_READY, handoff_channel
from tasks.retry import RetryPolicy
from valka.conf import valka_settings
from valka.db import conninfo, make_pool
from valka.listen import Listener

log = logging.getLogger("valka.dispatcher")


@dataclass
class NodeSettings:
    node_id: str
    lease_extension: float
    poll_interval: float
    shutdown_timeout: float
    worker_token: str
    keepalive_interval: float = 10.0
    sweep_interval: float = 5.0
    run_log_max_lines: int = 10_000
    run_log_max_bytes: int = 10 * 1024 * 1024
    buffer_bytes: int = 32 * 1024 * 1024
    max_worker_concurrency: int = 1_000
    retry_params: dict[str, float] = field(default_factory=dict)
    hop_log: str = ""  # a file for per-task timestamps (dispatcher.hops), for the benchmark
    held_queues: frozenset[str] = frozenset()  # slots freed once ends are written (the benchmark's floor)

    @classmethod
    def from_settings(cls) -> NodeSettings:
        node_id = valka_settings.NODE_ID or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        return cls(
            node_id=node_id,
            lease_extension=float(valka_settings.LEASE_EXTENSION),
            poll_interval=float(valka_settings.DISPATCH_POLL_INTERVAL),
            shutdown_timeout=float(valka_settings.SHUTDOWN_TIMEOUT),
            worker_token=valka_settings.WORKER_TOKEN,
            # A third of the scheduler's worker timeout, so two keep-alives may fail before it judges.
            keepalive_interval=min(10.0, float(valka_settings.WORKER_TIMEOUT) / 3),
            sweep_interval=float(valka_settings.DISPATCH_SWEEP_INTERVAL),
            run_log_max_lines=int(valka_settings.RUN_LOG_MAX_LINES),
            run_log_max_bytes=int(valka_settings.RUN_LOG_MAX_BYTES),
            buffer_bytes=int(valka_settings.DISPATCH_BUFFER_BYTES),
            max_worker_concurrency=int(valka_settings.MAX_WORKER_CONCURRENCY),
            retry_params=RetryPolicy.from_settings().sql_params(),
            hop_log=valka_settings.DISPATCH_HOP_LOG,
            held_queues=frozenset(valka_settings.DISPATCH_HELD_QUEUES),
        )


class DispatcherNode:
    def __init__(self, settings: NodeSettings | None = None) -> None:
        self.settings = s = settings or NodeSettings.from_settings()
        # Both pools plan with session settings (sql.WRITER_SESSION, sql.CLAIM_SESSION): through a
        # transaction pooler they would steer whoever got the server session next, and the node's own
        # statements would run without them.
        self.pool = make_pool(f"valka-dispatcher {s.node_id}", min_size=2, max_size=6, session=sql.WRITER_SESSION,
                              direct=True)
        # Claims run on connections of their own, set up for that one statement (sql.CLAIM_SESSION).
        self.claim_pool = make_pool(f"valka-dispatcher-claim {s.node_id}", min_size=1, max_size=2,
                                    session=sql.CLAIM_SESSION, direct=True)
        self.sessions = SessionRegistry()
        self.relay = Relay(pool=self.pool, sessions=self.sessions)
        self.writer = Writer(pool=self.pool, relay=self.relay, cancel=self.relay.cancel,
                             settings=WriterSettings(node_id=s.node_id, lease_extension=s.lease_extension,
                                                     retry_params=s.retry_params, buffer_bytes=s.buffer_bytes))
        # Idle slots offered to producers, who hand a task straight to this node on its own channel.
        self.handoff_channel = handoff_channel(s.node_id)
        self.offers = Offers(pool=self.claim_pool, node_id=s.node_id, channel=self.handoff_channel)
        self.claimer = Claimer(pool=self.claim_pool, sessions=self.sessions, unsend=self.writer.unsend,
                               offers=self.offers,
                               room=self.writer.room, controls=QueueControls(max_age=s.poll_interval),
                               hops=HopLog(s.hop_log) if s.hop_log else None,
                               settings=ClaimerSettings(node_id=s.node_id, poll_interval=s.poll_interval))
        self.handler = SessionHandler(pool=self.pool, sessions=self.sessions, writer=self.writer,
                                      claimer=self.claimer,
                                      settings=HandlerSettings(node_id=s.node_id, retry_params=s.retry_params,
                                                               run_log_max_lines=s.run_log_max_lines,
                                                               run_log_max_bytes=s.run_log_max_bytes,
                                                               held_queues=s.held_queues))
        if s.held_queues:
            self.writer.written = self.handler.results_written
        self.sweep = Sweep(pool=self.pool, sessions=self.sessions, relay=self.relay, interval=s.sweep_interval,
                           unsend=self.writer.unsend, node_id=s.node_id, offered=lambda: self.offers.ever,
                           starting=lambda: self.writer.starting)
        self.keepalive = Keepalive(pool=self.pool, sessions=self.sessions, node_id=s.node_id,
                                   interval=s.keepalive_interval)
        # Task events and log wake-ups for ApiService subscribers, on a LISTEN connection of their own
        # opened by the first subscriber: most nodes never serve one.
        self.fanout = Fanout(conninfo(application_name=f"valka-dispatcher-events {s.node_id}", direct=True))
        # Other dispatchers judge this node alive by this connection's application name
        # (sql.WORKER_ROW): it must be a session of its own, which a pooler would not keep.
        self.listener = Listener(
            conninfo(application_name=f"{sql.LISTEN_APPLICATION} {s.node_id}", direct=True),
            {TASK_READY: self.claimer.ready,
             QUEUE_CHANGED: self.claimer.queue_changed,
             QUEUE_SLOT_FREED: self.claimer.slot_freed,
             TASK_CANCELLED: lambda task_id: self.relay.cancel(task_id, "task cancelled"),
             SIGNAL_SENT: self.relay.on_signal,
             self.handoff_channel: self.claimer.handed},
            on_reconnect=self._on_listen_reconnect,
        )
        self._claim_stop = asyncio.Event()  # set first: no claims once a stop begins
        self._stop = asyncio.Event()  # then the listener and the keep-alive
        self._writer_stop = asyncio.Event()  # last, once every stream has handed in what it had
        self._tasks: list[asyncio.Task] = []

    def _on_listen_reconnect(self) -> None:
        """Notifications sent while the LISTEN connection was down are lost: look at the rows."""
        self.claimer.controls.forget()
        self.claimer.wake(None)
        self.sweep.reconnected()

    async def start(self) -> None:
        await self.pool.open(wait=False)
        await self.claim_pool.open(wait=False)
        self._tasks = [
            asyncio.create_task(self.claimer.run(self._claim_stop), name="claimer"),
            asyncio.create_task(self.writer.run(self._writer_stop), name="writer"),
            asyncio.create_task(self.listener.run(self._stop), name="listener"),
            asyncio.create_task(self.keepalive.run(self._stop), name="keepalive"),
            asyncio.create_task(self.sweep.run(self._stop), name="sweep"),
        ]

    async def stop(self, timeout: float | None = None) -> None:
        """Stop within `timeout` seconds (the shutdown timeout): stop claiming, tell the workers to
        move to another dispatcher, wait for them (and their results) for all but the last five
        seconds, hand what they still run over to their next session, and write what is left."""
        budget = self.settings.shutdown_timeout if timeout is None else timeout
        began = time.monotonic()
        self.handler.accepting = False
        self.handler.handing_over = True
        self._claim_stop.set()
        self.claimer.stopped = True  # a task handed over from now on is put back
        self.claimer.wake()
        try:
            await self.offers.withdraw_all()
        except Exception as exc:  # they lapse on their own
            log.warning("dispatcher: could not withdraw the offers (%s); they lapse within seconds", exc)
        drain = max(0.0, budget - 5.0)
        for session in self.sessions:
            session.draining = True
            session.send(protocol.server_shutdown("dispatcher shutting down", drain))
        while time.monotonic() - began < drain and any(s.in_flight and not s.closed for s in self.sessions):
            await asyncio.sleep(0.05)
        self._stop.set()
        for session in self.sessions:
            session.close()
        # Let the stream handlers run their cleanup (it hands runs over), then write what is left.
        await asyncio.sleep(0)
        while self.handler.open_streams and time.monotonic() - began < budget - 3.0:
            await asyncio.sleep(0.05)
        self._writer_stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.fanout.close()
        await self.claim_pool.close()
        await self.pool.close()
