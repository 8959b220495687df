"""Server-Sent Events: live task events and live log tails, served by the ASGI app.

Async views: a connected client costs a coroutine and a queue, not a thread or a
database connection (one LISTEN connection per process feeds them all; a stream's
reads take a pooled connection for the read only). A process serves at most
VALKA_MAX_STREAMS of them at once, and answers 503 past that.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from rest_framework import exceptions

from tasks import selectors
from tasks.api.auth import READ_TASKS, ApiKeyAuthentication, Need, check_key, check_staff, open_to_anonymous
from tasks.api.errors import error_body
from tasks.errors import Forbidden, ValkaError
from tasks.live import LAGGED, Lagged, decode_events, process_fanout, tail_run_log
from tasks.models import TaskLog
from tasks.notify import TASK_EVENT, TASK_LOG
from valka.conf import valka_settings
from valka.db import in_thread

KEEPALIVE = 15.0


def _refusal(request: HttpRequest, need: Need) -> JsonResponse | None:
    """The REST API's rule (tasks.api.auth.ApiAccess): a key whose scope, or a staff session whose
    permissions, cover `need`, or the anonymous setting for a caller without a key. The answer to
    a caller refused, or None."""
    sent_key = bool(request.headers.get("Authorization"))
    if open_to_anonymous(sent_key):
        return None
    try:
        if sent_key:
            try:
                found = ApiKeyAuthentication().authenticate(request)
            except exceptions.AuthenticationFailed as exc:
                return _unauthorized(str(exc.detail))
            if found is None:
                return _unauthorized("invalid API key")
            check_key(found[1], need)
            return None
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or not user.is_staff:
            return _unauthorized("authentication required")
        check_staff(user, need)
    except Forbidden as exc:
        return JsonResponse(error_body(exc.code, exc.message, exc.details), status=exc.http_status)
    return None


def _unauthorized(why: str) -> JsonResponse:
    response = JsonResponse(error_body("UNAUTHORIZED", why), status=401)
    response["WWW-Authenticate"] = "Bearer"
    return response


async def _check(request: HttpRequest, need: Need) -> JsonResponse | None:
    """Refused (401, 403), or too many streams open in this process already (503), or None."""
    if (refused := await in_thread(_refusal)(request, need)) is not None:
        return refused
    return _busy() if _open_streams >= valka_settings.MAX_STREAMS else None


def _busy() -> JsonResponse:
    response = JsonResponse(error_body(
        "UNAVAILABLE", f"this process serves {_open_streams} streams, its most (VALKA_MAX_STREAMS); "
                       "try again later"), status=503)
    response["Retry-After"] = "5"
    return response


_open_streams = 0  # the event streams and log tails this process serves (on its event loop)


class _Stream(StreamingHttpResponse):
    """An event stream that counts as open from its creation until the server closes it, which
    happens whether or not it streamed: a client that leaves before the first byte never starts
    the body, whose own clean-up would then never run."""

    def __init__(self, body: AsyncIterator[str], release: Callable[[], None]) -> None:
        super().__init__(body, content_type="text/event-stream")
        self["Cache-Control"] = "no-cache"
        self["X-Accel-Buffering"] = "no"
        self._release: Callable[[], None] | None = release
        self._loop = asyncio.get_running_loop()

    def close(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            try:  # Django closes a response from a thread; the count and the fanout live on the loop
                self._loop.call_soon_threadsafe(release)
            except RuntimeError:
                pass  # the loop is gone, and with it what `release` would undo
        super().close()


def _sse(event: str, data: Any, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _stream(body: AsyncIterator[str], unsubscribe: Callable[[], None]) -> HttpResponse:
    """The stream, or a 503 if this process serves VALKA_MAX_STREAMS already: counted here, with
    no wait between the count and the answer, so a burst of requests cannot pass the cap."""
    global _open_streams
    if _open_streams >= valka_settings.MAX_STREAMS:
        unsubscribe()
        return _busy()
    _open_streams += 1

    def release() -> None:
        global _open_streams
        _open_streams -= 1
        unsubscribe()

    return _Stream(body, release)


async def events(request: HttpRequest) -> Any:
    """`GET /api/v1/events?queue=...`: every task status change as it happens."""
    if (denied := await _check(request, READ_TASKS)) is not None:
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

    return _stream(body(), lambda: fanout.unsubscribe(TASK_EVENT, inbox))


def _log_dict(line: TaskLog) -> dict[str, Any]:
    return {"id": line.id, "timestamp": line.timestamp.isoformat(), "level": line.level,
            "message": line.message, "metadata": line.metadata}


def _run_open(run_id: Any) -> bool:
    return selectors.run_state(run_id=run_id)[1]


async def logs(request: HttpRequest, pk: str, run_id: str) -> Any:
    """`GET /api/v1/tasks/{id}/runs/{run_id}/logs/stream`: the run's lines so far, then new ones
    live until the run ends. `after` resumes after a line id."""
    if (denied := await _check(request, READ_TASKS)) is not None:
        return denied
    try:
        run = await in_thread(selectors.run_get)(task_id=pk, run_id=run_id)
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
                                                page=in_thread(_log_page), is_open=in_thread(_run_open)):
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

    return _stream(body(), lambda: fanout.unsubscribe(TASK_LOG, inbox))


def _log_page(run_id: str, after: int) -> list[TaskLog]:
    return selectors.run_log_page(run_id=run_id, after=after)
