"""`valka.v1.WorkerService/Session`: one long-lived stream per worker.

The handler reads the worker's messages in one task and writes the
dispatcher's in another (the outbox), so a slow reader never stalls
assignments and a result is taken as soon as it arrives.

Credentials: the worker token (metadata `authorization: Bearer <token>`) when one is set, and
with mutual TLS the client certificate, whose common name is the worker's identity: a hello
may name the worker by it (`w1`), or by it and a suffix (`w1:2`) so that several processes
share one certificate; an empty `worker_id` becomes the common name; any other id is refused.
"""

from __future__ import annotations

import asyncio
import hmac
import logging

import grpc

from dispatcher.handler import SessionHandler, WorkerIdTaken
from dispatcher.protocol import HELLO_TIMEOUT, MAX_CONCURRENCY, hello_problem
from dispatcher.session import CLOSE, WorkerSession
from valka_sdk.v1 import worker_pb2_grpc

log = logging.getLogger("valka.dispatcher")


def certificate_name(context: grpc.aio.ServicerContext) -> str:
    """The common name of the client certificate the TLS handshake verified, or ""."""
    names = (context.auth_context() or {}).get("x509_common_name") or ()
    return names[0].decode(errors="replace") if names else ""


def identity_problem(worker_id: str, name: str) -> str | None:
    """Why a worker whose certificate is named `name` may not say hello as `worker_id`, or None."""
    if worker_id == name or worker_id.startswith(f"{name}:"):
        return None
    return (f"worker id {worker_id!r} does not belong to the client certificate {name!r}: "
            f"with mutual TLS a worker's id is its certificate's common name, {name!r}, "
            f"or that name and a suffix ({name + ':1'!r})")


class WorkerService(worker_pb2_grpc.WorkerServiceServicer):
    """Streams of workers that present `worker_token` (when one is set), handed to `handler`.

    With `mutual_tls` (the port requires client certificates), the certificate's common name is
    the worker's identity: see the module's docstring."""

    def __init__(self, handler: SessionHandler, *, worker_token: str, node_id: str,
                 max_concurrency: int = MAX_CONCURRENCY, mutual_tls: bool = False) -> None:
        self.handler = handler
        self.worker_token = worker_token
        self.node_id = node_id
        self.max_concurrency = max_concurrency
        self.mutual_tls = mutual_tls

    async def Session(self, request_iterator, context: grpc.aio.ServicerContext):  # noqa: N802 (gRPC name)
        token = self.worker_token
        if token:
            sent = dict(context.invocation_metadata() or ()).get("authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid worker token is required "
                                    "(metadata 'authorization: Bearer <token>')")
        name = ""
        if self.mutual_tls:
            name = certificate_name(context)
            if not name:  # the handshake verified a certificate, but one without a common name
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the client certificate has no common "
                                    "name: with mutual TLS it names the worker (CN=<worker id>)")
        if not self.handler.accepting:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "dispatcher is shutting down")
        try:
            first = await asyncio.wait_for(context.read(), HELLO_TIMEOUT)
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"no hello within {HELLO_TIMEOUT:.0f} s")
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("request") != "hello":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "the first message of a session must be hello")
        hello = first.hello
        if self.mutual_tls:
            if not hello.worker_id:
                hello.worker_id = name
            elif (problem := identity_problem(hello.worker_id, name)) is not None:
                log.warning("dispatcher: refused a hello: %s", problem)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, problem)
        problem = hello_problem(hello, self.max_concurrency)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        self.handler.open_streams += 1
        session: WorkerSession | None = None
        reader: asyncio.Task | None = None
        try:
            session = await self.handler.open_session(hello)
            await context.send_initial_metadata((("x-valka-worker-id", session.worker_id),
                                                 ("x-valka-node-id", self.node_id)))
            reader = asyncio.create_task(self._read(session, context))
            while True:
                item = await session.outbox.get()
                if item is CLOSE:
                    break
                await context.write(item.message)
                if item.in_flight is not None:
                    self.handler.on_sent(session, item.in_flight)
        except asyncio.CancelledError:
            raise
        except WorkerIdTaken as exc:
            log.warning("dispatcher: refused a hello: %s", exc)
            context.set_code(grpc.StatusCode.ALREADY_EXISTS)
            context.set_details(str(exc))
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
                    await asyncio.shield(self.handler.close_session(session))
                except asyncio.CancelledError:
                    pass
            self.handler.open_streams -= 1

    async def _read(self, session: WorkerSession, context: grpc.aio.ServicerContext) -> None:
        handler = self.handler
        try:
            while True:
                await handler.wait_for_room()
                msg = await context.read()
                if msg is grpc.aio.EOF:
                    break
                kind = msg.WhichOneof("request")
                if kind == "task_result":
                    handler.on_result(session, msg.task_result)
                elif kind == "heartbeat":
                    handler.on_heartbeat(session, msg.heartbeat)
                elif kind == "log_batch":
                    handler.on_logs(session, msg.log_batch)
                elif kind == "signal_ack":
                    handler.on_signal_ack(session, msg.signal_ack.signal_id)
                elif kind == "shutdown":
                    handler.on_shutdown(session)
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

