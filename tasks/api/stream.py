"""Server-Sent Events: live task events and live log tails, served by the ASGI app.

Async views: a connected client costs a coroutine and a queue, not a thread
or a database connection (one LISTEN connection per process feeds them all).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from rest_framework import exceptions

from tasks import selectors
from tasks.api.auth import ApiKeyAuthentication
from tasks.api.errors import error_body
from tasks.errors import ValkaError
from tasks.live import LAGGED, Lagged, decode_events, process_fanout, tail_run_log
from tasks.models import TaskLog
from tasks.notify import TASK_EVENT, TASK_LOG
from valka.conf import valka_settings

KEEPALIVE = 15.0


def _allowed(request: HttpRequest) -> tuple[bool, str]:
    """The REST API's rule: an API key, a staff session, or the anonymous setting."""
    if valka_settings.API_ANONYMOUS:
        return True, ""
    if request.headers.get("Authorization"):
        try:
            return ApiKeyAuthentication().authenticate(request) is not None, "invalid API key"
        except exceptions.AuthenticationFailed as exc:
            return False, str(exc.detail)
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_staff), "authentication required"


async def _check(request: HttpRequest) -> JsonResponse | None:
    ok, why = await sync_to_async(_allowed)(request)
    if not ok:
        response = JsonResponse(error_body("UNAUTHORIZED", why or "authentication required"), status=401)
        response["WWW-Authenticate"] = "Bearer"
        return response
    return None


def _sse(event: str, data: Any, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _stream(body: AsyncIterator[str]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def events(request: HttpRequest) -> Any:
    """`GET /api/v1/events?queue=...`: every task status change as it happens."""
    if (denied := await _check(request)) is not None:
        return denied
    queue_filter = request.GET.get("queue") or request.GET.get("queue_name")
    fanout = process_fanout()
    inbox = fanout.subscribe(TASK_EVENT)
    try:
        # The response, whose headers a client takes as "connected", starts only once events flow:
        # a change made after that is never missed.
        await fanout.ready()
    except BaseException:
        fanout.unsubscribe(TASK_EVENT, inbox)
        raise

    async def body() -> AsyncIterator[str]:
        try:
            yield ": connected\n\n"
            while True:
                try:
                    payload = await asyncio.wait_for(inbox.get(), KEEPALIVE)
                except TimeoutError:
                    yield ": keepalive\n\n"
                    continue
                if payload == LAGGED:
                    yield _sse("lagged", {"message": "this client fell behind and is disconnected: connect again"})
                    return
                for event in decode_events(payload, queue=queue_filter):
                    yield _sse("task", event, event.get("event_id"))
        finally:
            fanout.unsubscribe(TASK_EVENT, inbox)

    return _stream(body())


def _log_dict(line: TaskLog) -> dict[str, Any]:
    return {"id": line.id, "timestamp": line.timestamp.isoformat(), "level": line.level,
            "message": line.message, "metadata": line.metadata}


def _run_open(run_id: Any) -> bool:
    return selectors.run_state(run_id=run_id)[1]


async def logs(request: HttpRequest, pk: str, run_id: str) -> Any:
    """`GET /api/v1/tasks/{id}/runs/{run_id}/logs/stream`: the run's lines so far, then new ones
    live until the run ends. `after` resumes after a line id."""
    if (denied := await _check(request)) is not None:
        return denied
    try:
        run = await sync_to_async(selectors.run_get)(task_id=pk, run_id=run_id)
        after = int(request.GET.get("after") or request.GET.get("after_id") or 0)
    except ValkaError as exc:
        return JsonResponse(error_body(exc.code, exc.message, exc.details), status=exc.http_status)
    except ValueError:
        return JsonResponse(error_body("VALIDATION_ERROR", "after: must be an integer log id",
                                       {"after": ["must be an integer log id"]}), status=400)
    fanout = process_fanout()
    inbox = fanout.subscribe(TASK_LOG)

    async def body() -> AsyncIterator[str]:
        try:
            await fanout.ready()
            yield ": connected\n\n"
            try:
                async for lines in tail_run_log(inbox, run_id=str(run.id), after=after, wait=KEEPALIVE,
                                                page=sync_to_async(_log_page), is_open=sync_to_async(_run_open)):
                    if lines is None:
                        yield ": keepalive\n\n"
                        continue
                    for line in lines:
                        yield _sse("log", _log_dict(line), str(line.id))
            except Lagged:
                yield _sse("lagged", {"message": "this client fell behind and is disconnected: resume with after"})
                return
            yield _sse("end", {"run_id": str(run.id)})
        finally:
            fanout.unsubscribe(TASK_LOG, inbox)

    return _stream(body())


def _log_page(run_id: str, after: int) -> list[TaskLog]:
    return selectors.run_log_page(run_id=run_id, after=after)
