"""What tracing costs on the hot paths, in process: enqueue, and the SDK worker's work per task.

Each is measured in rounds that alternate between no tracer provider (how Valka runs unless
the environment asks for traces) and one that records every span and drops it (the cost of
tracing on, without an exporter's). With no provider the tracing code only asks whether there
is one: `checks` times those questions on their own, in nanoseconds per call. Compare
`enqueue.off` and `worker.off` with the same figures of a commit before tracing to see what
the questions cost; the difference is within the noise of a round.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import timeit
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.test.globals_test import reset_trace_globals

from bench.measure import bar
from valka_sdk import tracing

QUEUE = "tracing"


class _Drop(SpanExporter):
    """Takes every span and keeps none."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


@contextmanager
def _provider(on: bool):
    """A provider that records and drops every span while `on`; none otherwise (as before and after)."""
    reset_trace_globals()
    provider = None
    if on:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_Drop()))
        trace.set_tracer_provider(provider)
    tracing.look_again()
    try:
        yield
    finally:
        if provider is not None:
            provider.shutdown()
        reset_trace_globals()
        tracing.look_again()


def _alternate(measure: Callable[[], float], rounds: int, desc: str) -> dict[str, Any]:
    """Per-item seconds of `measure()`, in rounds alternating off and on; medians in microseconds."""
    off: list[float] = []
    on: list[float] = []
    with bar(rounds * 2, desc, unit="round") as progress:
        for _ in range(rounds):
            for tracing_on, figures in ((False, off), (True, on)):
                with _provider(tracing_on):
                    figures.append(measure())
                progress.update(1)
    return {"off_us": statistics.median(off) * 1e6, "on_us": statistics.median(on) * 1e6,
            "off_rounds_us": [s * 1e6 for s in off], "on_rounds_us": [s * 1e6 for s in on]}


def enqueue(count: int, rounds: int = 5) -> dict[str, Any]:
    """`valka.enqueue`, one task and one commit per call: microseconds per task."""
    import valka

    def measure() -> float:
        start = time.perf_counter()
        for i in range(count):
            valka.enqueue("noop", queue=QUEUE, input={"i": i})
        return (time.perf_counter() - start) / count

    return {"count": count, **_alternate(measure, rounds, "enqueue, tracing off/on")}


def worker(count: int, rounds: int = 5) -> dict[str, Any]:
    """The SDK worker's own work for one run of a no-op async handler, from its assignment to its
    result in the outbox (no stream, no dispatcher): microseconds per task. The tasks carry a
    trace context, as they do once producers trace."""
    from valka_sdk import Worker
    from valka_sdk.tracing import TRACEPARENT
    from valka_sdk.v1 import worker_pb2 as pb

    metadata = json.dumps({TRACEPARENT: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    assignments = [pb.TaskAssignment(task_id=f"t{i}", task_run_id=f"r{i}", task_name="noop", queue_name=QUEUE,
                                     attempt_number=1, metadata=metadata) for i in range(count)]
    w = Worker(queues=[QUEUE], concurrency=count)

    @w.task("noop")
    async def noop(ctx: Any) -> None:
        return None

    async def run() -> float:
        w._loop = asyncio.get_running_loop()
        w._executor = ThreadPoolExecutor(max_workers=1)
        w._outbox = asyncio.Queue()
        start = time.perf_counter()
        for assignment in assignments:
            w._start(assignment)
        while w._outbox.qsize() < count:
            await asyncio.sleep(0)
        seconds = time.perf_counter() - start
        w._executor.shutdown()
        return seconds / count

    return {"count": count, **_alternate(lambda: asyncio.run(run()), rounds, "worker, tracing off/on")}


def checks(number: int = 200_000) -> dict[str, float]:
    """Nanoseconds per call of what the hot paths ask when no provider is set."""
    with _provider(False):
        return {name: timeit.timeit(call, number=number) / number * 1e9 for name, call in (
            ("tracer", tracing.tracer), ("carrier", tracing.carrier), ("headers", tracing.headers))}


def cleanup(database_url: str) -> None:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM tasks WHERE queue = %s", (QUEUE,))
