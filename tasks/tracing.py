"""The producer's side of tracing: every new task carries the trace context of the call that made it.

`services._create`, the one insert path (REST, gRPC, `valka.enqueue`, the Django backend in
process, replays, a schedule's trigger), runs inside `enqueue`. With a tracer provider set in
this process, that is a `valka.enqueue` producer span, a child of the current context, and the
tasks carry the span; with none, they carry the current context as it is (a REST or gRPC
caller's `traceparent`, attached by `valka.tracing`), and no span is made. With neither a
provider nor a current span, nothing happens at all.

The context goes into each task's `metadata` under `valka.traceparent` and `valka.tracestate`
(valka_sdk.tracing). A task whose metadata holds `valka.traceparent` already keeps it: a producer
propagating its own context (a client in another language, a replay of a traced task) wins.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry.trace import Span, SpanKind

from valka_sdk import tracing

if TYPE_CHECKING:
    from tasks.models import Task
    from tasks.specs import TaskSpec


@contextmanager
def enqueue(specs: Sequence[TaskSpec]) -> Iterator[Span | None]:
    """Around the insert of `specs`: the `valka.enqueue` span (None without a tracer provider),
    and each spec given the context its task carries; `created` then names the span's task."""
    tracer = tracing.tracer()
    if tracer is None:
        carried = tracing.carrier()
        if carried:
            stamp(specs, carried)
        yield None
        return
    queues = {spec.queue for spec in specs}
    attributes = tracing.messaging(next(iter(queues)) if len(queues) == 1 else None, **{
        "messaging.operation.type": "send", "messaging.operation.name": "enqueue",
        "messaging.batch.message_count": len(specs) if len(specs) != 1 else None,
        "valka.task_name": specs[0].task_name if len(specs) == 1 else None})
    with tracer.start_as_current_span("valka.enqueue", kind=SpanKind.PRODUCER, attributes=attributes) as span:
        stamp(specs, tracing.carrier())
        yield span


def created(span: Span | None, tasks: Sequence[tuple[Task, bool]]) -> None:
    """The span's message id, when it enqueued one task."""
    if span is not None and len(tasks) == 1:
        task, is_new = tasks[0]
        span.set_attribute("messaging.message.id", str(task.id))
        if not is_new:
            span.set_attribute("valka.existing", True)  # its id or idempotency key answered an earlier task


def stamp(specs: Sequence[TaskSpec], carried: dict[str, str]) -> None:
    """Put `carried` (the context's metadata keys) into each spec's metadata, and its JSON text,
    unless the spec holds `valka.traceparent` already."""
    if not carried:
        return
    head = json.dumps(carried, ensure_ascii=False)[:-1]  # '{"valka.traceparent": "...", ...' without '}'
    for spec in specs:
        if tracing.TRACEPARENT in spec.metadata:
            continue
        text = spec.metadata_text()
        spec.metadata = {**carried, **spec.metadata}
        spec.metadata_json = head + ("}" if text == "{}" else ", " + text[1:])
