"""REST endpoints: thin shells over `tasks.services` (writes) and `tasks.selectors` (reads)."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.http import JsonResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from tasks import selectors, services
from tasks.api import auth
from tasks.api import serializers as s
from tasks.api.errors import error_body
from tasks.api.pagination import PAGE_PARAMETERS, Page, one_page, paginate
from tasks.errors import ValidationError, ValkaError
from tasks.specs import parse_datetime
from tasks.sql import dashboard as dashboard_sql

ERRORS = {400: s.ErrorSerializer, 401: s.ErrorSerializer, 403: s.ErrorSerializer, 404: s.ErrorSerializer,
          409: s.ErrorSerializer, 413: s.ErrorSerializer}

# W3C trace context (docs/tracing.md): the tasks created carry it in their metadata.
TRACE_HEADERS = [
    OpenApiParameter("traceparent", str, OpenApiParameter.HEADER, description=(
        "W3C trace context of the caller: the tasks created carry it (or the server's valka.enqueue span under "
        "it) in metadata['valka.traceparent']. An invalid value is ignored: the tasks start a new trace.")),
    OpenApiParameter("tracestate", str, OpenApiParameter.HEADER, description="W3C tracestate, with traceparent."),
]


def query_param(request: Request, *names: str) -> str | None:
    """The first of `names` given a non-empty value in the query string (a parameter and its aliases)."""
    for name in names:
        value = request.query_params.get(name)
        if value not in (None, ""):
            return value
    return None


class TaskViewSet(viewsets.ViewSet):
    pagination_class = Page
    needs = {"list": auth.READ_TASKS, "retrieve": auth.READ_TASKS, "runs": auth.READ_TASKS, "logs": auth.READ_TASKS,
             "create": auth.CREATE_TASKS, "batch": auth.CREATE_TASKS, "cancel": auth.CANCEL_TASKS,
             "destroy": auth.DELETE_TASKS}

    @extend_schema(
        parameters=[
            OpenApiParameter("queue", str, description="Alias: queue_name"),
            OpenApiParameter("queue_name", str),
            OpenApiParameter("status", str, enum=s.STATUS_VALUES),
            OpenApiParameter("task_name", str),
            OpenApiParameter("created_after", OpenApiTypes.DATETIME),
            OpenApiParameter("created_before", OpenApiTypes.DATETIME),
            *PAGE_PARAMETERS,
        ],
        responses={200: s.TaskSerializer(many=True), **ERRORS},
    )
    def list(self, request: Request) -> Response:
        qs = selectors.task_list(
            queue=query_param(request, "queue", "queue_name"),
            status=query_param(request, "status"),
            task_name=query_param(request, "task_name"),
            created_after=parse_datetime("created_after", query_param(request, "created_after")),
            created_before=parse_datetime("created_before", query_param(request, "created_before")),
        )
        return paginate(self, request, qs, s.TaskSerializer)

    @extend_schema(request=s.TaskCreateSerializer, parameters=TRACE_HEADERS,
                   responses={201: s.TaskSerializer, 200: s.TaskSerializer, **ERRORS})
    def create(self, request: Request) -> Response:
        task, created = services.task_create_from_data(data=request.data)
        return Response(s.task_data(task), status=201 if created else 200)

    @extend_schema(request=s.TaskBatchCreateSerializer, parameters=TRACE_HEADERS,
                   responses={201: s.TaskBatchResponseSerializer, 200: s.TaskBatchResponseSerializer, **ERRORS},
                   description="Create up to 1,000 tasks with one INSERT. Each task is validated on its own "
                               "and has its own result, in order: 201 created, 200 its id or idempotency "
                               "key existed, or a 4xx with the API's error shape. The answer is 201 when any "
                               "task was created, else 200.")
    @action(detail=False, methods=["post"])
    def batch(self, request: Request) -> Response:
        body = request.data
        if not isinstance(body, dict) or "tasks" not in body:
            raise ValidationError.field("tasks", "this field is required: a list of task objects")
        results = []
        any_created = False
        task_data = s.TaskData()
        for outcome in services.task_create_many_from_data(items=body["tasks"]):
            if isinstance(outcome, ValkaError):
                results.append({"status": outcome.http_status,
                                "error": error_body(outcome.code, outcome.message, outcome.details)})
            else:
                task, created = outcome
                any_created = any_created or created
                results.append({"status": 201 if created else 200, "task": task_data(task)})
        return Response({"results": results}, status=201 if any_created else 200)

    @extend_schema(responses={200: s.TaskSerializer, **ERRORS})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(s.TaskSerializer(selectors.task_get(task_id=pk)).data)

    @extend_schema(responses={204: None, **ERRORS})
    def destroy(self, request: Request, pk: str) -> Response:
        services.task_delete(task_id=pk)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={200: s.TaskSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        return Response(s.TaskSerializer(services.task_cancel(task_id=pk)).data)

    @extend_schema(parameters=[*PAGE_PARAMETERS],
                   responses={200: s.TaskRunSerializer(many=True), **ERRORS})
    @action(detail=True, methods=["get"])
    def runs(self, request: Request, pk: str) -> Response:
        return paginate(self, request, selectors.task_runs(task_id=pk), s.TaskRunSerializer)

    @extend_schema(
        parameters=[OpenApiParameter("after", int, description="The last log id seen (alias: after_id)"),
                    OpenApiParameter("after_id", int), *PAGE_PARAMETERS],
        responses={200: s.TaskLogSerializer(many=True), **ERRORS},
    )
    def logs(self, request: Request, pk: str, run_id: str) -> Response:
        after = query_param(request, "after", "after_id")
        if after is not None:
            try:
                after_id: int | None = int(after)
            except ValueError:
                raise ValidationError.field("after", "must be an integer log id") from None
        else:
            after_id = None
        qs = selectors.run_logs(task_id=pk, run_id=run_id, after=after_id)
        return paginate(self, request, qs, s.TaskLogSerializer)


class DeadLetterViewSet(viewsets.ViewSet):
    pagination_class = Page
    needs = {"list": auth.READ_DEAD_LETTERS, "retrieve": auth.READ_DEAD_LETTERS, "replay": auth.REPLAY_DEAD_LETTERS}

    @extend_schema(
        parameters=[OpenApiParameter("queue", str, description="Alias: queue_name"),
                    OpenApiParameter("queue_name", str), *PAGE_PARAMETERS],
        responses={200: s.DeadLetterSerializer(many=True), **ERRORS},
    )
    def list(self, request: Request) -> Response:
        qs = selectors.dead_letter_list(queue=query_param(request, "queue", "queue_name"))
        return paginate(self, request, qs, s.DeadLetterSerializer)

    @extend_schema(responses={200: s.DeadLetterSerializer, **ERRORS})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(s.DeadLetterSerializer(selectors.dead_letter_get(dead_letter_id=pk)).data)

    @extend_schema(request=None, responses={201: s.TaskSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def replay(self, request: Request, pk: str) -> Response:
        task = services.dead_letter_replay(dead_letter_id=pk)
        return Response(s.TaskSerializer(task).data, status=201)


class WorkerViewSet(viewsets.ViewSet):
    pagination_class = Page
    needs = {"list": auth.READ_WORKERS}

    @extend_schema(parameters=[OpenApiParameter("status", str, enum=["CONNECTED", "DISCONNECTED"]),
                               *PAGE_PARAMETERS],
                   responses={200: s.WorkerSerializer(many=True), **ERRORS})
    def list(self, request: Request) -> Response:
        return paginate(self, request, selectors.worker_list(status=query_param(request, "status")),
                         s.WorkerSerializer)


class QueueViewSet(viewsets.ViewSet):
    pagination_class = Page
    needs = {"list": auth.READ_QUEUES, "retrieve": auth.READ_QUEUES, "partial_update": auth.CHANGE_QUEUES,
             "pause": auth.PAUSE_QUEUES, "resume": auth.PAUSE_QUEUES}

    @extend_schema(responses={200: s.QueueSerializer(many=True), **ERRORS},
                   description="Every queue that has tasks, workers or settings, on one page, by name.")
    def list(self, request: Request) -> Response:
        return one_page(s.QueueSerializer(selectors.queue_list(), many=True).data)

    @extend_schema(responses={200: s.QueueSerializer, **ERRORS})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(s.QueueSerializer(selectors.queue_get(name=pk)).data)

    @extend_schema(request=s.QueueChangeSerializer, responses={200: s.QueueSerializer, **ERRORS})
    def partial_update(self, request: Request, pk: str) -> Response:
        queue = services.queue_update(name=pk, data=request.data)
        return Response(s.QueueSerializer(selectors.queue_get(name=queue.name)).data)

    @extend_schema(request=s.QueuePauseSerializer, responses={200: s.QueueSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str) -> Response:
        queue = services.queue_pause_from_data(name=pk, data=request.data or None)
        return Response(s.QueueSerializer(selectors.queue_get(name=queue.name)).data)

    @extend_schema(request=None, responses={200: s.QueueSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        queue = services.queue_resume(name=pk)
        return Response(s.QueueSerializer(selectors.queue_get(name=queue.name)).data)


def healthz(request: Any) -> JsonResponse:
    """Public liveness/readiness: answers 200 only when the database answers."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(dashboard_sql.PING)
            cursor.fetchone()
    except Exception as exc:  # any database failure makes us unhealthy
        return JsonResponse({"status": "unhealthy", "database": "error", "message": type(exc).__name__},
                            status=503)
    return JsonResponse({"status": "ok", "database": "ok"})
