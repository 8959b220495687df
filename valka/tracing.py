"""Tracing in Valka's processes: the incoming trace context, and the tracer provider at start.

- `TraceContextMiddleware` (settings.MIDDLEWARE): a request with a W3C `traceparent` header is
  handled inside that context, so the tasks it creates carry it (`tasks.tracing`), unless an
  instrumentation of the server (opentelemetry-instrument, a Django instrumentation) made a
  span for the request already: that span, a child of the same header, is the context then.
  An invalid header is ignored: the tasks start a new trace. Never an error.
- `attached(incoming)`: the same for a gRPC call's metadata (`ApiService.CreateTask`).
- `configure(process)`: the process's tracer provider from the environment, at start
  (valka_sdk.tracing.configure): the web app, the dispatcher and the scheduler call it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.utils.decorators import sync_and_async_middleware
from opentelemetry import context as otel_context

from valka_sdk import tracing


@contextmanager
def attached(incoming: Mapping[str, Any]) -> Iterator[None]:
    """Inside the trace context `incoming` (headers, gRPC metadata) carries, if any."""
    context = tracing.remote_context(incoming)
    if context is None:
        yield
        return
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


@sync_and_async_middleware
def TraceContextMiddleware(get_response: Callable[[Any], Any]) -> Callable[[Any], Any]:  # noqa: N802
    """Requests that carry a `traceparent` header (or any, with a tracer provider set) run in its context."""
    if iscoroutinefunction(get_response):
        async def middleware_async(request: Any) -> Any:
            with request_attached(request):
                return await get_response(request)
        return middleware_async

    def middleware(request: Any) -> Any:
        with request_attached(request):
            return get_response(request)
    return middleware


def request_attached(request: Any) -> AbstractContextManager[None]:
    """Inside the trace context of a Django request, as TraceContextMiddleware runs it (and the REST
    create taken without the middleware, tasks.api.direct); nothing to do for a request without a
    `traceparent` header while no tracer provider is set."""
    if "HTTP_TRACEPARENT" not in request.META and not tracing.enabled():
        return nullcontext()
    return attached(request.headers)


def configure(process: str) -> bool:
    """The tracer provider of `process` ("web", "dispatcher", "scheduler") from the environment;
    its service name is `valka-<process>` unless OTEL_SERVICE_NAME says otherwise."""
    return tracing.configure(f"valka-{process}")
