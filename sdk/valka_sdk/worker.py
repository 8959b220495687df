"""The worker: one gRPC stream to a dispatcher, handlers per task name.

    worker = Worker("127.0.0.1:50051", queues=["emails"], concurrency=8)

    @worker.task("send_email")
    async def send_email(ctx):
        ctx.log("sending", to=ctx.input["to"])
        return {"sent": True}

    worker.run()

Async handlers run on the event loop; plain functions run in a thread pool.
A return value (JSON-serialisable) is the output; an exception is a
retryable failure; `NonRetryableError` fails the task for good. A failure's
`error_message` carries the exception's class path and traceback after its
summary line (`valka_sdk.errors`).

A task name with no registered handler is handed to `resolve` when given
(`Worker(resolve=fn)`): `fn(task_name)` returns a handler, kept for the name from
then on, or None; with no handler, or when `fn` raises, the task fails for good.
The Django worker (`valka_sdk.django`) resolves dotted paths to `@task` functions so.

`capture_logging=True` sends what Python's `logging` says inside a handler (through
the root logger) to the run's log too, but for the loggers named in
`capture_logging_except` (and the SDK's own). `interrupt_sync_handlers=True` raises
`TaskCancelled` inside a plain function's thread when its task is cancelled (at its
next Python instruction: a blocking call finishes first); otherwise sync handlers
check `ctx.cancelled`.

Credentials and encryption (docs/security.md):

- `token="..."`: the dispatcher's VALKA_WORKER_TOKEN, sent with every session.
- `tls=True`: TLS, checking the dispatcher's certificate against the system's root
  certificates (`grpc.ssl_channel_credentials()`).
- `tls=<grpc.ChannelCredentials>`: TLS with credentials of your own: a private CA, and for
  mutual TLS the worker's certificate and key, whose common name is the worker's id:

      creds = grpc.ssl_channel_credentials(root_certificates=open("ca.crt", "rb").read(),
                                           private_key=open("w1.key", "rb").read(),
                                           certificate_chain=open("w1.crt", "rb").read())
      worker = Worker("dispatcher.internal:50051", tls=creds, worker_id="w1")

  With mutual TLS the `worker_id` must be the certificate's common name (`w1`) or that name and
  a suffix (`w1:1`, `w1:2`: several processes sharing one certificate); the dispatcher refuses
  any other (PERMISSION_DENIED, and `run()` raises).
- `tls=False` (the default): plaintext, for a dispatcher on the same host or a trusted network.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import inspect
import json
import logging
import os
import random
import signal as signal_module
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span

from valka_sdk import aio, tracing
from valka_sdk.context import Signal, TaskContext
from valka_sdk.errors import MAX_ERROR, NonRetryableError, TaskCancelled, format_failure
from valka_sdk.v1 import worker_pb2 as pb
from valka_sdk.v1 import worker_pb2_grpc

log = logging.getLogger("valka.worker")

Handler = Callable[[TaskContext], Any]
Resolver = Callable[[str], Handler | None]
SignalHook = Callable[[TaskContext, Signal], Any]

MAX_MESSAGE = 16 * 1024 * 1024  # bytes of one gRPC message, the dispatcher's limit: a bigger one ends the stream
# What one message may carry, so that none is ever over MAX_MESSAGE (the dispatcher applies the same limits):
MAX_OUTPUT = 15 * 1024 * 1024  # bytes of a task's output (JSON); a bigger one fails the run
# MAX_ERROR (valka_sdk.errors): characters of an error message; longer ones are cut
LOG_BATCH_BYTES = 1024 * 1024  # a log batch is sent once it holds this much (or 500 lines)
LOG_BATCH_LINES = 500
INSTANCE_KEY = "valka.instance"  # the hello metadata's key for Worker.instance_id

CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
]


# The run whose handler is executing, for `capture_logging`: set in each run's asyncio task, and
# carried into the handler's thread.
_current_run: contextvars.ContextVar[TaskContext] = contextvars.ContextVar("valka_current_run")


class _Refusal(NonRetryableError):
    """A failure the worker itself finds (no handler, an output it cannot send): its message alone
    says it all, with no traceback."""


@dataclass(eq=False)
class _Running:
    ctx: TaskContext
    task: asyncio.Task
    run_id: str
    signal_hooks: list[asyncio.Task] = field(default_factory=list)
    # The thread running a sync handler, while it runs (for interrupt_sync_handlers).
    thread: int | None = None
    interrupted: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class _RunLogHandler(logging.Handler):
    """Python logging inside a handler, copied to its run's log (`Worker(capture_logging=True)`)."""

    def __init__(self, ignore: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.ignore = ("valka.worker", "valka_sdk", *ignore)

    def emit(self, record: logging.LogRecord) -> None:
        ctx = _current_run.get(None)
        if ctx is None or record.name.startswith(self.ignore):
            return
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            ctx.log(message, _level(record.levelno), logger=record.name)
        except Exception:
            self.handleError(record)


class Worker:
    def __init__(
        self,
        server: str = "127.0.0.1:50051",
        *,
        queues: list[str] | tuple[str, ...] = ("default",),
        concurrency: int = 4,
        name: str | None = None,
        worker_id: str | None = None,
        heartbeat_interval: float | None = None,
        drain_timeout: float = 30.0,
        token: str | None = None,
        metadata: dict[str, Any] | None = None,
        reconnect_max_delay: float = 10.0,
        tls: bool | grpc.ChannelCredentials = False,
        resolve: Resolver | None = None,
        capture_logging: bool = False,
        capture_logging_except: tuple[str, ...] = (),
        interrupt_sync_handlers: bool = False,
    ) -> None:
        if not queues:
            raise ValueError("a worker needs at least one queue")
        # The channels' credentials: None for plaintext (see the module's docstring).
        if tls is True:
            self._credentials: grpc.ChannelCredentials | None = grpc.ssl_channel_credentials()
        elif tls is False or tls is None:
            self._credentials = None
        elif isinstance(tls, grpc.ChannelCredentials):
            self._credentials = tls
        else:
            raise TypeError(f"tls must be True, False or grpc.ChannelCredentials, not {type(tls).__name__}")
        # Several dispatchers ("host:port,host:port"): a broken stream moves on to the next one.
        self.servers = [s.strip() for s in server.split(",") if s.strip()]
        if not self.servers:
            raise ValueError("a worker needs a dispatcher address")
        self.server = self.servers[0]
        self.queues = list(queues)
        self.concurrency = max(1, concurrency)
        self.name = name or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        self.worker_id = worker_id or str(uuid.uuid4())  # kept across reconnects
        # This process's own id, sent in the hello's metadata: the dispatcher tells a reconnect of
        # this worker (let in at once) from another process given the same worker_id (refused
        # while this one is connected).
        self.instance_id = uuid.uuid4().hex
        # Default: VALKA_HEARTBEAT_INTERVAL (seconds) or 30 s; the dispatcher extends leases by
        # VALKA_LEASE_EXTENSION (60 s) on each, so one lost heartbeat costs nothing.
        self.heartbeat_interval = heartbeat_interval or float(os.environ.get("VALKA_HEARTBEAT_INTERVAL", "30"))
        self.drain_timeout = drain_timeout
        self.token = token
        self.metadata = metadata or {}
        self.reconnect_max_delay = reconnect_max_delay
        self._handlers: dict[str, Handler] = {}
        self._is_async: dict[str, bool] = {}
        self._resolve = resolve
        self.capture_logging = capture_logging
        self.capture_logging_except = tuple(capture_logging_except)  # logger names (and their children) left out
        self.interrupt_sync_handlers = interrupt_sync_handlers
        self._signal_hook: SignalHook | None = None
        self._running: dict[str, _Running] = {}
        self._outbox: asyncio.Queue[pb.WorkerRequest | None] | None = None
        # Results and acknowledgements made while no stream is open (a dispatcher handing its
        # workers over to another): sent first on the next stream.
        self._held: list[pb.WorkerRequest] = []
        self._handover = False  # the dispatcher asked us to move: keep the running tasks
        self._reconnect_soon = False
        self._logs: deque[pb.LogEntry] = deque()
        self._stopping: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.connected = False

    # -- registration --
    def task(self, name: str) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of `name`."""

        def register(fn: Handler) -> Handler:
            self.register(name, fn)
            return fn

        return register

    def register(self, name: str, fn: Handler) -> None:
        self._handlers[name] = fn
        self._is_async[name] = inspect.iscoroutinefunction(fn)

    def on_signal(self, fn: SignalHook) -> SignalHook:
        """Call `fn(ctx, signal)` for every signal to a running task; acknowledged when it returns."""
        self._signal_hook = fn
        return fn

    # -- running --
    def run(self) -> None:
        """Run until SIGTERM/SIGINT, then drain and exit."""
        aio.run(self.arun(install_signal_handlers=True))

    def stop(self) -> None:
        """Ask the worker to drain and exit (thread-safe)."""
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)

    async def arun(self, install_signal_handlers: bool = False) -> None:
        tracing.configure("valka-worker")  # when the environment asks for it, and none is set
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="valka-handler")
        if install_signal_handlers:
            for sig in (signal_module.SIGTERM, signal_module.SIGINT):
                self._loop.add_signal_handler(sig, self._stopping.set)
        log_handler = _RunLogHandler(self.capture_logging_except) if self.capture_logging else None
        if log_handler is not None:
            logging.getLogger().addHandler(log_handler)
        delay = 0.2
        try:
            while not self._stopping.is_set():
                started = time.monotonic()
                try:
                    await self._session()
                except grpc.aio.AioRpcError as exc:
                    if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                                      grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                        log.error("worker: the dispatcher refused the session: %s", exc.details())
                        raise
                    if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
                        # Another process holds this worker_id; it may be on its way out: try again.
                        log.error("worker: the dispatcher refused the session: %s", exc.details())
                    else:
                        log.warning("worker: stream to %s broke: %s %s", self.server, exc.code().name,
                                    exc.details())
                except (ConnectionError, OSError) as exc:
                    log.warning("worker: cannot reach %s: %s", self.server, exc)
                self.connected = False
                if self._stopping.is_set():
                    break
                self.server = self.servers[(self.servers.index(self.server) + 1) % len(self.servers)]
                if time.monotonic() - started > 10 or self._reconnect_soon:
                    delay = 0.2  # it was up for a while, or it was asked to move: start the backoff over
                    self._reconnect_soon = False
                sleep = random.uniform(delay / 2, delay)
                delay = min(delay * 2, self.reconnect_max_delay)
                try:
                    await asyncio.wait_for(self._stopping.wait(), sleep)
                except TimeoutError:
                    pass
        finally:
            await self._cancel_all("worker stopped")
            self._executor.shutdown(wait=False, cancel_futures=True)
            if log_handler is not None:
                logging.getLogger().removeHandler(log_handler)

    async def _session(self) -> None:
        metadata = (("authorization", f"Bearer {self.token}"),) if self.token else None
        if self._credentials is None:
            channel = grpc.aio.insecure_channel(self.server, options=CHANNEL_OPTIONS)
        else:
            channel = grpc.aio.secure_channel(self.server, self._credentials, options=CHANNEL_OPTIONS)
        async with channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            call = stub.Session(metadata=metadata)
            await call.write(pb.WorkerRequest(hello=pb.WorkerHello(
                worker_id=self.worker_id, worker_name=self.name, queues=self.queues,
                concurrency=self.concurrency, metadata=json.dumps({**self.metadata, INSTANCE_KEY: self.instance_id}),
            )))
            # The dispatcher answers a hello it takes with its headers (naming our worker id); one
            # it refuses ends the stream, and what we hold waits for the next. Until the answer
            # comes, results are held too: a stream that never opens must not take them along.
            headers = await call.initial_metadata()
            outbox: asyncio.Queue[pb.WorkerRequest | None] = asyncio.Queue()
            helpers = []
            if any(key == "x-valka-worker-id" for key, _ in headers or ()):
                # What was made while no stream was open goes first; then a heartbeat names the tasks
                # still running, so a dispatcher that carried them over from our last stream settles them.
                for request in self._held:
                    outbox.put_nowait(request)
                self._held = []
                outbox.put_nowait(pb.WorkerRequest(heartbeat=pb.Heartbeat(
                    active_task_ids=list(self._running), timestamp_ms=int(time.time() * 1000))))
                self._handover = False
                self._outbox = outbox
                helpers = [
                    asyncio.create_task(self._write(call, outbox)),
                    asyncio.create_task(self._heartbeats()),
                    asyncio.create_task(self._flush_logs()),
                    asyncio.create_task(self._watch_stop(call)),
                ]
                self.connected = True
                log.info("worker %s connected to %s (queues: %s)", self.name, self.server, ", ".join(self.queues))
            draining = False
            try:
                while True:
                    try:
                        msg = await call.read()
                    except asyncio.CancelledError:
                        if self._stopping is not None and self._stopping.is_set() and call.cancelled():
                            break  # our own stop gave up waiting for the server
                        raise
                    if msg is grpc.aio.EOF:
                        break
                    kind = msg.WhichOneof("response")
                    if kind == "task_assignment":
                        self._start(msg.task_assignment)
                    elif kind == "task_cancellation":
                        self._cancel(msg.task_cancellation.task_id, msg.task_cancellation.reason)
                    elif kind == "task_signal":
                        self._signal(msg.task_signal)
                    elif kind == "server_shutdown":
                        log.info("worker: dispatcher is shutting down (%s); %d task(s) running",
                                 msg.server_shutdown.reason, len(self._running))
                        draining = self._handover = True
                        asyncio.create_task(self._move_on(call, msg.server_shutdown.drain_seconds))
                    # heartbeat_ack and anything newer need no answer
                if not draining:
                    await call.code()  # surface the status of a stream the server ended
            finally:
                if self._outbox is outbox:
                    self._outbox = None
                for helper in helpers:
                    helper.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
                # What this stream did not take waits for the next one.
                while not outbox.empty():
                    self._hold(outbox.get_nowait())
                if not self._handover:
                    # Results of handlers still running cannot reach the server any more: the
                    # dispatcher releases those tasks for a retry, so stop them here.
                    await self._cancel_all("connection to the dispatcher lost")

    async def _move_on(self, call: Any, drain_seconds: int) -> None:
        """The dispatcher is stopping: let the running tasks finish and report here for up to
        `drain_seconds` (it assigns nothing more meanwhile), then end our side of the stream and
        reconnect (to the next dispatcher of the list). Tasks still running carry on: that
        dispatcher takes them over from this one. (If the dispatcher ends the stream first, at
        the end of its drain, the same holds.)"""
        await self._wait_running(float(drain_seconds))
        self._reconnect_soon = True
        await self._flush_now()
        self._end_writing()

    async def _watch_stop(self, call: Any) -> None:
        assert self._stopping is not None
        await self._stopping.wait()
        log.info("worker %s: stopping; draining %d running task(s)", self.name, len(self._running))
        self._send(pb.WorkerRequest(shutdown=pb.GracefulShutdown(reason="worker stopping")))
        await self._wait_running(self.drain_timeout)
        await self._cancel_all("worker stopped")
        await self._flush_now()
        self._end_writing()
        # The dispatcher ends the stream when it sees ours end; don't wait forever for it.
        await asyncio.sleep(5)
        call.cancel()

    def _end_writing(self) -> None:
        """End our side of the stream once what is queued for it is written; what is made from
        now on waits for the next stream."""
        outbox, self._outbox = self._outbox, None
        if outbox is not None:
            outbox.put_nowait(None)

    async def _wait_running(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _write(self, call: Any, outbox: asyncio.Queue[pb.WorkerRequest | None]) -> None:
        while (request := await outbox.get()) is not None:
            try:
                await call.write(request)
            except BaseException:
                # It may or may not have reached the server: a result written twice is taken
                # once (the server closes a run once), one lost would run its task again.
                self._hold(request)
                raise
        await call.done_writing()

    def _send(self, request: pb.WorkerRequest) -> None:
        if self._outbox is not None:
            self._outbox.put_nowait(request)
        else:
            self._hold(request)

    def _hold(self, request: pb.WorkerRequest | None) -> None:
        """Keep a result or a signal's acknowledgement for the next stream; the rest (heartbeats,
        log lines of a stream that broke) is not worth a late send."""
        if request is not None and request.WhichOneof("request") in ("task_result", "signal_ack"):
            self._held.append(request)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            self._send(pb.WorkerRequest(heartbeat=pb.Heartbeat(
                active_task_ids=list(self._running), timestamp_ms=int(time.time() * 1000))))

    async def _flush_logs(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            await self._flush_now()

    async def _flush_now(self) -> None:
        """Send the buffered log lines in batches of at most LOG_BATCH_LINES lines or about
        LOG_BATCH_BYTES bytes (a line is at most 64 KiB, context.MAX_LOG_LINE): far under MAX_MESSAGE.
        With no stream open they wait for the next."""
        while self._logs and self._outbox is not None:
            batch: list[pb.LogEntry] = []
            size = 0
            while self._logs and len(batch) < LOG_BATCH_LINES and size < LOG_BATCH_BYTES:
                entry = self._logs.popleft()
                size += entry.ByteSize()
                batch.append(entry)
            self._send(pb.WorkerRequest(log_batch=pb.LogBatch(entries=batch)))

    # -- tasks --
    def _start(self, assignment: pb.TaskAssignment) -> None:
        assert self._loop is not None
        ctx = TaskContext(assignment, emit_log=self._logs.append, loop=self._loop, ack_signal=self._ack)
        task = asyncio.create_task(self._execute(ctx), name=f"valka-task-{assignment.task_id}")
        self._running[assignment.task_id] = _Running(ctx=ctx, task=task, run_id=assignment.task_run_id)

    async def _execute(self, ctx: TaskContext) -> None:
        """One run, from its assignment to its result: it starts here, and ends when the result is
        handed to the stream (a run stopped because the worker is going away sends none). With a
        tracer provider set, the run is a `valka.run` span (valka_sdk.tracing), current while the
        handler runs, so that the handler's own spans nest under it."""
        _current_run.set(ctx)  # this run's asyncio task only
        span = self._start_span(ctx)
        result = pb.TaskResult(task_id=ctx.task_id, task_run_id=ctx.run_id)
        failure: BaseException | None = None
        cancelled: str | None = None
        try:
            output = await self._call(self._handler_for(ctx.task_name), ctx)
            result.output = _output_text(output)
            result.success = True
        except asyncio.CancelledError:
            cancelled = ctx.cancel_reason or "cancelled"
            if not ctx.cancelled_by_server:
                # The worker is going away: no result; the dispatcher releases the task for a retry.
                self._running.pop(ctx.task_id, None)
                if span is not None:
                    tracing.end_run(span, attempt=ctx.attempt, success=False, retryable=True, error="",
                                    exc=None, cancel_reason=cancelled)
                raise
            result.success, result.retryable = False, False
            result.error_message = f"cancelled: {cancelled}"
        except TaskCancelled as exc:
            cancelled = str(exc)
            result.success, result.retryable = False, False
            result.error_message = f"cancelled: {exc}"
        except _Refusal as exc:
            failure = exc
            result.success, result.retryable = False, False
            result.error_message = format_failure(str(exc))
        except NonRetryableError as exc:
            failure = exc
            result.success, result.retryable = False, False
            result.error_message = format_failure(str(exc) or type(exc).__name__, exc)
        except Exception as exc:
            failure = exc
            result.success, result.retryable = False, True
            result.error_message = format_failure(f"{type(exc).__name__}: {exc}", exc)
        finally:
            entry = self._running.pop(ctx.task_id, None)
            if entry is not None:
                for hook in entry.signal_hooks:
                    hook.cancel()
        result.error_message = result.error_message[:MAX_ERROR]
        if span is not None:
            tracing.end_run(span, attempt=ctx.attempt, success=result.success, retryable=result.retryable,
                            error=result.error_message, exc=failure, cancel_reason=cancelled)
        await self._finish(result)

    def _start_span(self, ctx: TaskContext) -> Span | None:
        """The run's span, made current in the run's asyncio task (and so in a sync handler's
        thread, which gets a copy of its context), or None while no tracer provider is set."""
        tracer = tracing.tracer()
        if tracer is None:
            return None
        span = tracing.start_run(tracer, task_id=ctx.task_id, run_id=ctx.run_id, task_name=ctx.task_name,
                                 queue=ctx.queue, attempt=ctx.attempt, metadata=ctx.metadata,
                                 worker_id=self.worker_id, worker_name=self.name)
        # The run's asyncio task ends with the run, and its context with it: nothing to detach.
        otel_context.attach(trace.set_span_in_context(span))
        ctx._span = span
        return span

    async def _finish(self, result: pb.TaskResult) -> None:
        """The run's end: its log lines, then its result, to the stream (or held for the next one)."""
        if self._logs:  # the run's lines reach the server before its result
            await self._flush_now()
        self._send(pb.WorkerRequest(task_result=result))

    def _handler_for(self, task_name: str) -> Handler:
        """The registered handler of `task_name`, or the resolver's (kept from then on)."""
        handler = self._handlers.get(task_name)
        if handler is None and self._resolve is not None:
            try:
                handler = self._resolve(task_name)
            except NonRetryableError:
                raise
            except Exception as exc:
                raise NonRetryableError(f"cannot resolve task {task_name!r}: {type(exc).__name__}: {exc}") from exc
            if handler is not None:
                self.register(task_name, handler)
        if handler is None:
            raise _Refusal(f"no handler registered for task {task_name!r} on worker {self.name}")
        return handler

    async def _call(self, handler: Handler, ctx: TaskContext) -> Any:
        """Run the handler: an async one on the loop, a plain one in the thread pool."""
        if self._is_async[ctx.task_name]:
            return await handler(ctx)
        assert self._loop is not None
        entry = self._running.get(ctx.task_id)
        output = await self._loop.run_in_executor(self._executor, contextvars.copy_context().run,
                                                  self._in_thread, handler, ctx, entry)
        if inspect.isawaitable(output):
            output = await output
        return output

    def _in_thread(self, handler: Handler, ctx: TaskContext, entry: _Running | None) -> Any:
        """A sync handler in its thread, which `_cancel` may interrupt while (and only while) it runs."""
        if entry is None or not self.interrupt_sync_handlers:
            return handler(ctx)
        with entry.lock:
            entry.thread = threading.get_ident()
        try:
            if ctx.cancelled:  # cancelled before its thread ran it: `_cancel` found no thread to interrupt
                raise TaskCancelled(ctx.cancel_reason or "cancelled")
            return handler(ctx)
        finally:
            with entry.lock:
                entry.thread = None
                if entry.interrupted:  # a TaskCancelled still pending must not land in the pool's code
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)

    def _cancel(self, task_id: str, reason: str) -> None:
        entry = self._running.get(task_id)
        if entry is None:
            return
        entry.ctx._cancel(reason or "cancelled", by_server=True)
        entry.task.cancel()  # async handlers stop at their next await; sync ones see ctx.cancelled
        if self.interrupt_sync_handlers:
            with entry.lock:
                if entry.thread is not None and not entry.interrupted:
                    entry.interrupted = True
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(entry.thread),
                                                               ctypes.py_object(TaskCancelled))

    async def _cancel_all(self, reason: str) -> None:
        entries = list(self._running.values())
        for entry in entries:
            entry.ctx._cancel(reason, by_server=False)
            entry.task.cancel()
        if entries:
            await asyncio.gather(*(e.task for e in entries), return_exceptions=True)
        self._running.clear()

    # -- signals --
    def _signal(self, message: pb.TaskSignal) -> None:
        entry = self._running.get(message.task_id)
        if entry is None:
            return  # not ours (any more): unacknowledged, the server redelivers it to the next attempt
        try:
            payload = json.loads(message.payload) if message.payload else None
        except ValueError:
            payload = message.payload
        signal = Signal(id=message.signal_id, type=message.signal_name, payload=payload,
                        sent_at_ms=message.timestamp_ms)
        if self._signal_hook is not None:
            entry.signal_hooks.append(asyncio.create_task(self._run_hook(entry.ctx, signal)))
        else:
            entry.ctx._deliver(signal)

    async def _run_hook(self, ctx: TaskContext, signal: Signal) -> None:
        assert self._signal_hook is not None
        try:
            result = self._signal_hook(ctx, signal)
            if isinstance(result, Awaitable):
                await result
        except Exception:
            log.exception("worker: signal hook failed for %s", signal.id)
        self._ack(signal.id)

    def _ack(self, signal_id: str) -> None:
        request = pb.WorkerRequest(signal_ack=pb.SignalAck(signal_id=signal_id))
        if self._loop is not None and self._loop.is_running():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._loop:
                self._send(request)
            else:
                self._loop.call_soon_threadsafe(self._send, request)


def _level(levelno: int) -> str:
    """A Python logging level as a run log's level."""
    if levelno >= logging.ERROR:
        return "ERROR"
    if levelno >= logging.WARNING:
        return "WARN"
    return "INFO" if levelno >= logging.INFO else "DEBUG"


def _output_text(output: Any) -> str:
    """A handler's return value as the run's output (JSON text), or a refusal naming what is wrong."""
    if output is None:
        return ""
    try:
        text = json.dumps(output, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _Refusal(f"the handler's return value is not JSON: {exc}") from None
    if len(text) > MAX_OUTPUT // 4 and (size := len(text.encode())) > MAX_OUTPUT:
        raise _Refusal(f"output too large: {size} bytes, limit {MAX_OUTPUT}")
    return text
