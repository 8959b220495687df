"""`valka.v1.ApiService`: the gRPC twin of the REST API, over the same service layer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
from django.db.models import Max

from dispatcher import protocol
from dispatcher.errors import grpc_message, grpc_status
from signals.permissions import SEND_SIGNALS
from signals.services import signal_send
from tasks import selectors, services
from tasks.api import auth
from tasks.api.auth import Need, api_key_of, check_key, open_to_anonymous
from tasks.api.pagination import Page, after_cursor, cursor_of
from tasks.errors import Forbidden, ValkaError
from tasks.live import LAGGED, Fanout, Lagged, decode_events, tail_run_log
from tasks.models import TaskLog
from tasks.notify import TASK_EVENT, TASK_LOG
from valka import tracing
from valka.conf import valka_settings
from valka.db import in_thread
from valka_sdk.v1 import api_pb2, api_pb2_grpc


async def _call(context: grpc.aio.ServicerContext, fn, *args, **kwargs):
    try:
        return await in_thread(fn)(*args, **kwargs)
    except ValkaError as exc:
        await context.abort(grpc_status(exc), grpc_message(exc))


def create_task(request: api_pb2.CreateTaskRequest, incoming: dict[str, str] | None = None):
    """The request's task, in the trace context of the call's metadata (`traceparent`), if any."""
    metadata, concurrency_key = protocol.split_concurrency_key(protocol.load_json("metadata", request.metadata))
    data = {
        "queue": request.queue_name,
        "task_name": request.task_name,
        "input": protocol.load_json("input", request.input),
        "metadata": metadata,
        "concurrency_key": concurrency_key,
        "priority": request.priority,
        # proto3 cannot tell 0 from unset: 0 means "the default".
        "max_retries": request.max_retries or None,
        "timeout_seconds": request.timeout_seconds or None,
        "idempotency_key": request.idempotency_key or None,
        "run_at": request.scheduled_at or None,
    }
    with tracing.attached(incoming or {}):
        task, _created = services.task_create_from_data(data=data)
    return task


def send_signal(request: api_pb2.SendSignalRequest):
    return signal_send(task_id=request.task_id, signal_type=request.signal_name,
                       payload=protocol.load_json("payload", request.payload))


def list_tasks(request: api_pb2.ListTasksRequest):
    """One page, and the token of the next (a cursor, as the REST API's `next_cursor`: any depth
    costs what the first page does); "" on the last page."""
    status = protocol.FROM_PROTO_STATUS.get(request.status) if request.status else None
    size = request.pagination.page_size or Page.default_limit  # the REST API's page sizes
    size = max(1, min(size, Page.max_limit))
    qs = selectors.task_list(queue=request.queue_name or None, status=status.value if status else None)
    token = request.pagination.page_token
    page = after_cursor(qs, token, name="pagination.page_token") if token else qs
    tasks = list(page[:size + 1])
    more = len(tasks) > size
    return tasks[:size], cursor_of(tasks[size - 1], qs) if more else ""


def _last_log_id(run_id: str) -> int:
    return TaskLog.objects.filter(run_id=run_id).aggregate(last=Max("id"))["last"] or 0


def _log_page(run_id: str, after: int) -> list[TaskLog]:
    return selectors.run_log_page(run_id=run_id, after=after)


def _run_open(run_id: str) -> bool:
    return selectors.run_state(run_id=run_id)[1]


async def _authorize(context: grpc.aio.ServicerContext, need: Need) -> None:
    """Every call needs an API key (metadata `authorization: Bearer <key>`) whose scope covers `need`,
    as the REST API does; VALKA_API_ANONYMOUS opens the API to callers that send no key (one sent
    is still held to its scope). The refusal of a key says nothing about which keys exist."""
    sent = dict(context.invocation_metadata() or ()).get("authorization", "")
    if open_to_anonymous(bool(sent)):
        return
    key = await in_thread(api_key_of)(sent) if sent else None
    if key is None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                            "a valid API key is required (metadata 'authorization: Bearer <key>')")
    try:
        check_key(key, need)
    except Forbidden as exc:
        await context.abort(grpc_status(exc), grpc_message(exc))


class ApiService(api_pb2_grpc.ApiServiceServicer):
    def __init__(self, fanout: Fanout) -> None:
        self.fanout = fanout  # the node's: its LISTEN connection opens with the first subscriber
        self.subscribers = 0  # SubscribeEvents and SubscribeLogs streams open on this node

    @contextlib.asynccontextmanager
    async def _subscription(self, context: grpc.aio.ServicerContext, topic: str) -> AsyncIterator[asyncio.Queue[str]]:
        """An inbox of the fanout's `topic` for one subscription, counted against VALKA_MAX_STREAMS and
        refused past that many open ones, as a web process refuses an event stream or a log tail past
        it: each holds an inbox that every event is copied into, and a stream, on the node that serves
        the workers. Counted out when the subscription ends."""
        if self.subscribers >= valka_settings.MAX_STREAMS:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"this dispatcher serves {self.subscribers} subscriptions, its most "
                                "(VALKA_MAX_STREAMS); subscribe again later, or to another dispatcher")
        self.subscribers += 1
        inbox = self.fanout.subscribe(topic)
        try:
            yield inbox
        finally:
            self.fanout.unsubscribe(topic, inbox)
            self.subscribers -= 1

    async def CreateTask(self, request, context):  # noqa: N802
        await _authorize(context, auth.CREATE_TASKS)
        task = await _call(context, create_task, request, dict(context.invocation_metadata() or ()))
        return api_pb2.CreateTaskResponse(task=protocol.task_meta(task))

    async def GetTask(self, request, context):  # noqa: N802
        await _authorize(context, auth.READ_TASKS)
        task = await _call(context, selectors.task_get, task_id=request.task_id)
        return api_pb2.GetTaskResponse(task=protocol.task_meta(task))

    async def ListTasks(self, request, context):  # noqa: N802
        await _authorize(context, auth.READ_TASKS)
        tasks, token = await _call(context, list_tasks, request)
        return api_pb2.ListTasksResponse(tasks=[protocol.task_meta(t) for t in tasks], next_page_token=token)

    async def CancelTask(self, request, context):  # noqa: N802
        await _authorize(context, auth.CANCEL_TASKS)
        task = await _call(context, services.task_cancel, task_id=request.task_id)
        return api_pb2.CancelTaskResponse(task=protocol.task_meta(task))

    async def SubscribeEvents(self, request, context):  # noqa: N802
        """Every task status change from now on (of `queue_name` if given), until the client leaves."""
        await _authorize(context, auth.READ_TASKS)
        async with self._subscription(context, TASK_EVENT) as inbox:
            await self.fanout.ready()
            await context.send_initial_metadata((("x-valka-subscribed", "events"),))
            while True:
                payload = await inbox.get()
                if payload == LAGGED:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                        "lagged: this subscriber fell behind and is disconnected; subscribe again")
                for event in decode_events(payload, queue=request.queue_name or None):
                    yield protocol.task_event(event)

    async def SubscribeLogs(self, request, context):  # noqa: N802
        """A run's log lines (the earlier ones too with include_history), live until the run ends."""
        await _authorize(context, auth.READ_TASKS)
        if not protocol.valid_uuid(request.task_run_id):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"run {request.task_run_id!r} not found")
        exists, _ = await in_thread(selectors.run_state)(run_id=request.task_run_id)
        if not exists:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"run {request.task_run_id} not found")
        async with self._subscription(context, TASK_LOG) as inbox:
            await self.fanout.ready()
            after = 0 if request.include_history else await in_thread(_last_log_id)(request.task_run_id)
            try:
                async for lines in tail_run_log(inbox, run_id=request.task_run_id, after=after, wait=5.0,
                                                page=in_thread(_log_page), is_open=in_thread(_run_open)):
                    for line in lines or ():
                        yield protocol.log_entry(line)
            except Lagged:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    "lagged: this subscriber fell behind and is disconnected; subscribe again")

    async def SendSignal(self, request, context):  # noqa: N802
        await _authorize(context, SEND_SIGNALS)
        signal, delivered = await _call(context, send_signal, request)
        return api_pb2.SendSignalResponse(signal_id=str(signal.id), delivered=delivered)
