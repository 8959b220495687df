"""OpenTelemetry tracing: one trace from the call that enqueues a task to every attempt that runs it.

A task carries its producer's W3C trace context in its `metadata`, under the reserved keys
`valka.traceparent` and `valka.tracestate` (`TRACEPARENT`, `TRACESTATE`): every `valka.v1` SDK
gets them unchanged in `TaskAssignment.metadata`, and one that knows nothing of tracing ignores
them. This module, which needs `opentelemetry-api` only, is shared by the server and the SDK:

- `enabled()` / `tracer()`: tracing is on in this process once a tracer provider is set (by
  `configure`, by `opentelemetry-instrument`, or by the application). Until then nothing here
  makes a span, and every caller checks first, so tracing costs a look-up per task;
- `carrier()`: the current span's context as those metadata keys; `parent_of(metadata)`: the
  context they hold, as the parent of a run's span (an invalid one is ignored: a new trace);
- `start_run` / `end_run` / `log_ids`: the SDK worker's `valka.run <task_name>` span;
- `configure(service_name)`: a tracer provider from the standard environment
  (`OTEL_TRACES_EXPORTER`, `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`, ...), when it asks
  for one and `opentelemetry-sdk` is installed (the `otel` extra).

docs/tracing.md describes the spans and their attributes.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import extract
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("valka.tracing")

TRACEPARENT = "valka.traceparent"  # the task's metadata keys for its producer's W3C trace context
TRACESTATE = "valka.tracestate"
SYSTEM = "valka"  # messaging.system
INSTRUMENTATION = "valka"  # the tracer's name

_W3C = TraceContextTextMapPropagator()
_WIRE = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}
LOOK_AGAIN = 1.0  # seconds between two looks for a tracer provider while there is none
_tracer: trace.Tracer | None = None
_look_at = 0.0  # time.monotonic() of the next look


def tracer() -> trace.Tracer | None:
    """Valka's tracer, or None while no tracer provider is set in this process (nothing to record).

    `trace.get_tracer_provider()` reads the environment on each call while none is set, which
    cost more than a microsecond, on every task: so the answer is kept, and while it is None it
    is asked again at most every LOOK_AGAIN seconds. A provider is set once per process; one set
    after Valka first asked is seen within that time, or at once after `look_again()`."""
    global _tracer, _look_at
    if _tracer is not None:
        return _tracer
    now = time.monotonic()
    if now < _look_at:
        return None
    _look_at = now + LOOK_AGAIN
    provider = trace.get_tracer_provider()
    if not isinstance(provider, ProxyTracerProvider | NoOpTracerProvider):
        _tracer = provider.get_tracer(INSTRUMENTATION)
    return _tracer


def look_again() -> None:
    """Forget the answer of `tracer()`: call it after setting or resetting a tracer provider that
    must be seen at once (`configure` does; tests that reset OpenTelemetry's globals do)."""
    global _tracer, _look_at
    _tracer, _look_at = None, 0.0


def enabled() -> bool:
    return tracer() is not None


# -- The trace context a task carries. --

def carrier(context: Context | None = None) -> dict[str, str]:
    """The current (or `context`'s) span context as the task metadata's keys, or {} when there is
    no valid span: the keys of a new task."""
    if not trace.get_current_span(context).get_span_context().is_valid:
        return {}
    headers: dict[str, str] = {}
    _W3C.inject(headers, context)
    return {_WIRE[name]: value for name, value in headers.items() if name in _WIRE}


def headers() -> dict[str, str]:
    """The current span's context as W3C headers (`traceparent`, `tracestate`), or {}: what the
    SDK's REST clients send, for the server to store on the task."""
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    out: dict[str, str] = {}
    _W3C.inject(out)
    return out


def current() -> Context | None:
    """The current context, when it has a valid span: to carry into work done later (`run_in`)."""
    return otel_context.get_current() if trace.get_current_span().get_span_context().is_valid else None


def run_in[T](context: Context, fn: Callable[[], T]) -> T:
    """`fn()` with `context` current: work deferred from a traced call (a send at the commit) joins
    that call's trace."""
    token = otel_context.attach(context)
    try:
        return fn()
    finally:
        otel_context.detach(token)


def parent_of(metadata: Mapping[str, Any]) -> Context | None:
    """The context a task's metadata carries, or None when it carries none (or an invalid one)."""
    traceparent = metadata.get(TRACEPARENT)
    if not isinstance(traceparent, str):
        return None
    state = metadata.get(TRACESTATE)
    context = _W3C.extract({"traceparent": traceparent, "tracestate": state if isinstance(state, str) else ""})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def ids_of(metadata: Any) -> tuple[str, str] | None:
    """(trace id, span id) of the context a task's metadata carries, as hex, or None (the console)."""
    context = parent_of(metadata) if isinstance(metadata, Mapping) else None
    if context is None:
        return None
    span_context = trace.get_current_span(context).get_span_context()
    return trace.format_trace_id(span_context.trace_id), trace.format_span_id(span_context.span_id)


def link_of(metadata_text: str | None) -> trace.SpanContext | None:
    """The span context in a task's metadata as JSON text (the claim's rows), or None; the text
    is parsed only when it names the key."""
    if not metadata_text or TRACEPARENT not in metadata_text:
        return None
    try:
        metadata = json.loads(metadata_text)
    except ValueError:
        return None
    context = parent_of(metadata) if isinstance(metadata, dict) else None
    return trace.get_current_span(context).get_span_context() if context is not None else None


def remote_context(incoming: Mapping[str, Any]) -> Context | None:
    """The context of an incoming request's headers or gRPC metadata (`traceparent`, or what the
    configured propagators read), unless a span is current already (an instrumentation of the
    server made it, a child of those headers): None then, and when they carry none."""
    if trace.get_current_span().get_span_context().is_valid:
        return None
    if "traceparent" not in incoming and not enabled():
        return None  # nothing to pass on, and no tracing here to read other formats for
    context = extract(incoming)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def messaging(queue: str | None, **more: Any) -> dict[str, Any]:
    """A span's messaging attributes (OpenTelemetry's messaging conventions), and `more`."""
    attributes: dict[str, Any] = {"messaging.system": SYSTEM}
    if queue is not None:
        attributes["messaging.destination.name"] = queue
    attributes.update((name, value) for name, value in more.items() if value is not None)
    return attributes


# -- The worker's span of a run. --

def start_run(tracer: trace.Tracer, *, task_id: str, run_id: str, task_name: str, queue: str, attempt: int,
              metadata: Mapping[str, Any], worker_id: str, worker_name: str) -> Span:
    """`valka.run <task_name>`: a consumer span, the child of the context the task carries (a new
    trace when it carries none)."""
    return tracer.start_span(
        f"valka.run {task_name}", context=parent_of(metadata) or Context(), kind=SpanKind.CONSUMER,
        attributes=messaging(queue, **{
            "messaging.operation.type": "process", "messaging.operation.name": "run",
            "messaging.message.id": task_id, "valka.task_name": task_name, "valka.attempt": attempt,
            "valka.run_id": run_id, "valka.worker": worker_id, "valka.worker.name": worker_name}))


def end_run(span: Span, *, attempt: int, success: bool, retryable: bool, error: str, exc: BaseException | None,
            cancel_reason: str | None) -> None:
    """End a run's span: ERROR with the exception on a failure, an event for a retry asked for or a
    cancellation."""
    if cancel_reason is not None:
        span.add_event("valka.cancelled", {"valka.cancel_reason": cancel_reason})
    elif not success:
        if exc is not None:
            span.record_exception(exc, escaped=True)
        span.set_status(Status(StatusCode.ERROR, error.split("\n", 1)[0]))
        span.set_attribute("valka.retryable", retryable)
        if retryable:
            span.add_event("valka.retry", {"valka.attempt": attempt})
    span.end()


def log_ids(run_span: Span) -> dict[str, str]:
    """The trace and span id a run's log line carries: the current span's (a handler's own span
    inside the run), else the run's."""
    run_context = run_span.get_span_context()
    current = trace.get_current_span().get_span_context()
    span_context = current if current.is_valid and current.trace_id == run_context.trace_id else run_context
    return {"trace_id": trace.format_trace_id(span_context.trace_id),
            "span_id": trace.format_span_id(span_context.span_id)}


# -- A tracer provider from the environment. --

def _wanted() -> bool:
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _exporter_name(name: str) -> str:
    """`otlp` as the SDK reads it: over gRPC, or HTTP when OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL says so."""
    if name != "otlp":
        return name
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    return "otlp_proto_http" if (protocol or "grpc").strip().lower().startswith("http") else "otlp_proto_grpc"


def configure(service_name: str) -> bool:
    """Set a tracer provider from the environment, as OpenTelemetry's SDKs read it, if the
    environment asks for one (`OTEL_TRACES_EXPORTER` other than `none`, or an OTLP endpoint) and
    none is set yet. Its resource honours `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`
    (`service_name` when they name none), its sampler `OTEL_TRACES_SAMPLER`, its batches
    `OTEL_BSP_*`, each exporter its own variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, ...). Returns
    whether this call set one."""
    if not _wanted() or not isinstance(trace.get_tracer_provider(), ProxyTracerProvider):
        return False
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("tracing: the environment asks for traces, but opentelemetry-sdk is not installed "
                    "(pip install 'valka-sdk[otel]', or 'valka[otel]' for the server)")
        return False
    exporters = []
    for name in (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(","):
        name = _exporter_name(name.strip().lower())
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            log.warning("tracing: no span exporter named %r is installed (OTEL_TRACES_EXPORTER)", name)
            continue
        exporters.append(next(iter(found)).load()())
    if not exporters:
        return False
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    look_again()
    log.info("tracing: exporting spans of %s (%s)", resource.attributes.get(SERVICE_NAME),
             ", ".join(type(e).__name__ for e in exporters))
    return True
