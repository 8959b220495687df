"""`valka.v1.WorkerService/Session`: one long-lived stream per worker.

The handler reads the worker's messages in one task and writes the
dispatcher's in another (the outbox), so a slow reader never stalls
assignments and a result is taken as soon as it arrives.
"""

from __future__ import annotations

import asyncio
import hmac
import logging

import grpc

from dispatcher.node import DispatcherNode
from dispatcher.session import CLOSE, WorkerSession
from valka.v1 import worker_pb2_grpc

log = logging.getLogger("valka.dispatcher")

HELLO_TIMEOUT = 30.0
MAX_QUEUES = 100


class WorkerService(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, node: DispatcherNode) -> None:
        self.node = node

    async def Session(self, request_iterator, context: grpc.aio.ServicerContext):  # noqa: N802 (gRPC name)
        token = self.node.settings.worker_token
        if token:
            sent = dict(context.invocation_metadata() or ()).get("authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid worker token is required "
                                    "(metadata 'authorization: Bearer <token>')")
        if self.node.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "dispatcher is shutting down")
        try:
            first = await asyncio.wait_for(context.read(), HELLO_TIMEOUT)
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no hello within 30 s")
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("request") != "hello":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "the first message of a session must be hello")
        hello = first.hello
        queues = [q for q in hello.queues if q]
        if not queues:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello.queues: at least one queue is required")
        if len(queues) > MAX_QUEUES or any(len(q) > 255 for q in queues):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello.queues: at most 100 names of 255 characters")
        if hello.concurrency < 0 or hello.concurrency > 10_000:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello.concurrency: must be between 1 and 10000")
        if len(hello.worker_id) > 255 or len(hello.worker_name) > 255:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello.worker_id/worker_name: at most 255 characters")
        for name, values in (("queues", queues), ("worker_id", [hello.worker_id]),
                             ("worker_name", [hello.worker_name])):
            if any("\x00" in v for v in values):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"hello.{name}: must not contain NUL characters")
        self.node.open_streams += 1
        session: WorkerSession | None = None
        reader: asyncio.Task | None = None
        try:
            session = await self.node.open_session(hello)
            await context.send_initial_metadata((("x-valka-worker-id", session.worker_id),
                                                 ("x-valka-node-id", self.node.settings.node_id)))
            reader = asyncio.create_task(self._read(session, context))
            while True:
                item = await session.outbox.get()
                if item is CLOSE:
                    break
                await context.write(item.message)
                if item.in_flight is not None:
                    self.node.on_sent(session, item.in_flight)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("dispatcher: stream of %s ended: %s", session.worker_id if session else "?", exc)
            if session is None:  # the session could not be opened (the database, mostly): worth a retry
                context.set_code(grpc.StatusCode.UNAVAILABLE)
                context.set_details("the dispatcher could not open the session; try again")
        finally:
            if reader is not None:
                reader.cancel()
            if session is not None:
                try:
                    await asyncio.shield(self.node.close_session(session))
                except asyncio.CancelledError:
                    pass
            self.node.open_streams -= 1

    async def _read(self, session: WorkerSession, context: grpc.aio.ServicerContext) -> None:
        node = self.node
        try:
            while True:
                msg = await context.read()
                if msg is grpc.aio.EOF:
                    break
                kind = msg.WhichOneof("request")
                if kind == "task_result":
                    node.on_result(session, msg.task_result)
                elif kind == "heartbeat":
                    node.on_heartbeat(session, msg.heartbeat)
                elif kind == "log_batch":
                    node.on_logs(session, msg.log_batch)
                elif kind == "signal_ack":
                    node.signal_handler.on_ack(session, msg.signal_ack.signal_id)
                elif kind == "shutdown":
                    node.on_shutdown(session)
                elif kind == "hello":
                    log.warning("dispatcher: worker %s sent a second hello; ignored", session.worker_id)
                else:
                    log.warning("dispatcher: worker %s sent an empty or unknown message; ignored",
                                session.worker_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("dispatcher: reading from %s failed: %s", session.worker_id, exc)
            # Ends the call with this status rather than OK (a malformed message, mostly).
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details(f"cannot read the stream: {exc}"[:500])
        finally:
            session.close()

