"""`valka.v1.ApiService`: the gRPC twin of the REST API, over the same service layer."""

from __future__ import annotations

import grpc
from asgiref.sync import sync_to_async
from django.db import close_old_connections

from dispatcher import convert
from dispatcher.errors import grpc_message, grpc_status
from signals.services import signal_send
from tasks import selectors, services
from tasks.errors import ValidationError, ValkaError
from valka.v1 import api_pb2, api_pb2_grpc

DEFAULT_PAGE, MAX_PAGE = 50, 1000


def _db(fn):
    """Run a sync service-layer call in a worker thread with a healthy Django connection."""

    def call(*args, **kwargs):
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(call, thread_sensitive=False)


async def _call(context: grpc.aio.ServicerContext, fn, *args, **kwargs):
    try:
        return await _db(fn)(*args, **kwargs)
    except ValkaError as exc:
        await context.abort(grpc_status(exc), grpc_message(exc))


def create_task(request: api_pb2.CreateTaskRequest):
    data = {
        "queue": request.queue_name,
        "task_name": request.task_name,
        "input": convert.load_json("input", request.input),
        "metadata": convert.load_json("metadata", request.metadata),
        "priority": request.priority,
        # proto3 cannot tell 0 from unset: 0 means "the default".
        "max_retries": request.max_retries or None,
        "timeout_seconds": request.timeout_seconds or None,
        "idempotency_key": request.idempotency_key or None,
        "run_at": request.scheduled_at or None,
    }
    task, _created = services.task_create_from_data(data=data)
    return task


def send_signal(request: api_pb2.SendSignalRequest):
    return signal_send(task_id=request.task_id, signal_type=request.signal_name,
                       payload=convert.load_json("payload", request.payload))


def list_tasks(request: api_pb2.ListTasksRequest):
    status = convert.FROM_PROTO_STATUS.get(request.status) if request.status else None
    size = request.pagination.page_size or DEFAULT_PAGE
    size = max(1, min(size, MAX_PAGE))
    token = request.pagination.page_token
    try:
        offset = int(token) if token else 0
        if offset < 0:
            raise ValueError
    except ValueError:
        raise ValidationError.field("pagination.page_token", "is not a token this server issued") from None
    qs = selectors.task_list(queue=request.queue_name or None, status=status.value if status else None)
    tasks = list(qs[offset:offset + size + 1])
    more = len(tasks) > size
    return tasks[:size], str(offset + size) if more else ""


class ApiService(api_pb2_grpc.ApiServiceServicer):
    async def CreateTask(self, request, context):  # noqa: N802
        task = await _call(context, create_task, request)
        return api_pb2.CreateTaskResponse(task=convert.task_meta(task))

    async def GetTask(self, request, context):  # noqa: N802
        task = await _call(context, selectors.task_get, task_id=request.task_id)
        return api_pb2.GetTaskResponse(task=convert.task_meta(task))

    async def ListTasks(self, request, context):  # noqa: N802
        tasks, token = await _call(context, list_tasks, request)
        return api_pb2.ListTasksResponse(tasks=[convert.task_meta(t) for t in tasks], next_page_token=token)

    async def CancelTask(self, request, context):  # noqa: N802
        task = await _call(context, services.task_cancel, task_id=request.task_id)
        return api_pb2.CancelTaskResponse(task=convert.task_meta(task))

    async def SendSignal(self, request, context):  # noqa: N802
        signal, delivered = await _call(context, send_signal, request)
        return api_pb2.SendSignalResponse(signal_id=str(signal.id), delivered=delivered)
