"""The SDK's tracing, in process (valka_sdk.tracing): a run's `valka.run` span, its log lines' ids,
the REST clients' `traceparent`, and a tracer provider from the environment. Across real
processes: tests/e2e/test_tracing.py."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.test.globals_test import reset_trace_globals
from opentelemetry.trace import SpanKind, StatusCode

from tests.sdk.test_worker import Runs
from valka_sdk import Client, NonRetryableError, Worker, tracing
from valka_sdk.v1 import worker_pb2 as pb

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PARENT_TRACE, PARENT_SPAN = int("0af7651916cd43dd8448eb211c80319c", 16), int("b7ad6b7169203331", 16)


def _run(worker: Worker, task_name: str, metadata: dict | None = None, attempt: int = 1,
         cancel: str | None = None) -> tuple[pb.TaskResult, list[pb.LogEntry]]:
    async def scenario():
        async with Runs(worker) as runs:
            worker._start(pb.TaskAssignment(task_id="t1", task_run_id="r1", task_name=task_name, queue_name="q",
                                            attempt_number=attempt, metadata=json.dumps(metadata or {})))
            if cancel is not None:
                await asyncio.sleep(0.05)
                worker._cancel("t1", cancel)
            result = await runs.result()
            lines = [e for m in runs.sent if m.WhichOneof("request") == "log_batch" for e in m.log_batch.entries]
            return result, lines

    return asyncio.run(scenario())


def _worker() -> Worker:
    worker = Worker(queues=["q"], worker_id="w-1", name="mailer")
    inner = trace.get_tracer("the handler's library")

    @worker.task("send")
    async def send(ctx):
        ctx.log("outside")
        with inner.start_as_current_span("http call"):
            ctx.log("inside", to="ada")
        return {"ok": True}

    @worker.task("sync_send")
    def sync_send(ctx):
        with inner.start_as_current_span("db query"):
            ctx.log("in a thread")
        return None

    @worker.task("flaky")
    async def flaky(ctx):
        raise RuntimeError(f"attempt {ctx.attempt} failed")

    @worker.task("fatal")
    async def fatal(ctx):
        raise NonRetryableError("bad input")

    @worker.task("slow")
    async def slow(ctx):
        await asyncio.sleep(5)

    return worker


def test_a_run_is_a_consumer_span_child_of_the_context_its_task_carries(spans):
    result, lines = _run(_worker(), "send", {tracing.TRACEPARENT: PARENT, tracing.TRACESTATE: "v=1"}, attempt=2)
    assert result.success
    run, = [s for s in spans.get_finished_spans() if s.name == "valka.run send"]
    http, = [s for s in spans.get_finished_spans() if s.name == "http call"]
    assert run.kind == SpanKind.CONSUMER and run.status.status_code == StatusCode.UNSET
    assert (run.context.trace_id, run.parent.span_id) == (PARENT_TRACE, PARENT_SPAN)
    assert run.context.trace_state.get("v") == "1"
    assert dict(run.attributes) == {
        "messaging.system": "valka", "messaging.destination.name": "q", "messaging.operation.type": "process",
        "messaging.operation.name": "run", "messaging.message.id": "t1", "valka.task_name": "send",
        "valka.attempt": 2, "valka.run_id": "r1", "valka.worker": "w-1", "valka.worker.name": "mailer"}
    assert http.parent.span_id == run.context.span_id, "the handler's own calls nest under the run"
    ids = [json.loads(line.metadata) for line in lines]
    assert ids == [{"trace_id": trace.format_trace_id(PARENT_TRACE), "span_id": trace.format_span_id(span_id)}
                   | extra for span_id, extra in ((run.context.span_id, {}), (http.context.span_id, {"to": "ada"}))]


def test_a_sync_handler_s_thread_runs_inside_the_run_s_span(spans):
    result, lines = _run(_worker(), "sync_send")
    assert result.success
    run, = [s for s in spans.get_finished_spans() if s.name == "valka.run sync_send"]
    query, = [s for s in spans.get_finished_spans() if s.name == "db query"]
    assert run.parent is None, "a task that carries no context starts a trace"
    assert query.parent.span_id == run.context.span_id
    assert json.loads(lines[0].metadata)["span_id"] == trace.format_span_id(query.context.span_id)


def test_a_failure_is_an_error_with_its_exception_and_a_retry_event(spans):
    result, _ = _run(_worker(), "flaky", {tracing.TRACEPARENT: PARENT}, attempt=1)
    assert not result.success and result.retryable
    run, = spans.get_finished_spans()
    assert run.status.status_code == StatusCode.ERROR and run.status.description == "RuntimeError: attempt 1 failed"
    assert [event.name for event in run.events] == ["exception", "valka.retry"]
    exception = run.events[0].attributes
    assert exception["exception.type"] == "RuntimeError" and exception["exception.message"] == "attempt 1 failed"
    assert "Traceback" in exception["exception.stacktrace"]
    assert run.events[1].attributes["valka.attempt"] == 1 and run.attributes["valka.retryable"] is True


def test_a_failure_for_good_has_no_retry_event(spans):
    result, _ = _run(_worker(), "fatal")
    run, = spans.get_finished_spans()
    assert not result.retryable and run.status.status_code == StatusCode.ERROR
    assert [event.name for event in run.events] == ["exception"] and run.attributes["valka.retryable"] is False


def test_a_cancellation_is_an_event(spans):
    result, _ = _run(_worker(), "slow", cancel="by a test")
    assert result.error_message == "cancelled: by a test"
    run, = spans.get_finished_spans()
    assert [(e.name, dict(e.attributes)) for e in run.events] == [
        ("valka.cancelled", {"valka.cancel_reason": "by a test"})]
    assert run.status.status_code == StatusCode.UNSET


@pytest.mark.parametrize("traceparent", ["00-nonsense", 42, "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"])
def test_an_invalid_context_in_the_metadata_starts_a_new_trace(spans, traceparent):
    result, _ = _run(_worker(), "send", {tracing.TRACEPARENT: traceparent})
    assert result.success
    run, = [s for s in spans.get_finished_spans() if s.name == "valka.run send"]
    assert run.parent is None


def test_no_tracer_provider_no_span_and_log_lines_as_they_were():
    result, lines = _run(_worker(), "send", {tracing.TRACEPARENT: PARENT})
    assert result.success and not tracing.enabled()
    assert [(line.message, line.metadata) for line in lines] == [("outside", ""), ("inside", '{"to": "ada"}')]


def test_the_rest_client_sends_the_current_context():
    seen: list[httpx.Headers] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(201, json={"id": "x"} if request.url.path.endswith("tasks") else {"results": []})

    client = Client("http://valka.test")
    client._http = httpx.Client(base_url="http://valka.test", transport=httpx.MockTransport(answer))
    client.create_task("t")
    with trace.use_span(trace.NonRecordingSpan(trace.SpanContext(PARENT_TRACE, PARENT_SPAN, is_remote=True,
                                                                 trace_flags=trace.TraceFlags(1)))):
        client.create_task("t")
        client.create_tasks([{"task_name": "t", "queue": "q"}])
    assert [h.get("traceparent") for h in seen] == [None, PARENT, PARENT]


@pytest.fixture
def fresh_globals():
    """configure() sets the process's tracer provider: none before the test, none after."""
    reset_trace_globals()
    tracing.look_again()
    yield
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()
    reset_trace_globals()
    tracing.look_again()


@pytest.mark.parametrize("env", [{}, {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1"},
                                 {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}])
def test_configure_leaves_tracing_off_unless_the_environment_asks(fresh_globals, monkeypatch, env):
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                 "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tracing.configure("valka-test") is False and not tracing.enabled()


@pytest.mark.parametrize("service", [None, "shop-worker"])
def test_configure_from_the_environment(fresh_globals, monkeypatch, service):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,console")
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    if service:
        monkeypatch.setenv("OTEL_SERVICE_NAME", service)
    else:
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    assert tracing.configure("valka-test") is True and tracing.enabled()
    provider = trace.get_tracer_provider()
    assert provider.resource.attributes["service.name"] == (service or "valka-test")
    exporters = [p.span_exporter for p in provider._active_span_processor._span_processors]
    assert [type(e).__name__ for e in exporters] == ["OTLPSpanExporter", "ConsoleSpanExporter"]
    assert tracing.configure("again") is False, "a provider is set once"


def test_configure_without_the_sdk_installed_warns_and_leaves_tracing_off(fresh_globals, monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    for module in ("opentelemetry.sdk", "opentelemetry.sdk.resources", "opentelemetry.sdk.trace",
                   "opentelemetry.sdk.trace.export"):
        monkeypatch.setitem(sys.modules, module, None)
    with caplog.at_level(logging.WARNING, "valka.tracing"):
        assert tracing.configure("valka-test") is False
    assert "valka-sdk[otel]" in caplog.text and not tracing.enabled()



@pytest.mark.django_db(transaction=True)
def test_the_django_backend_sends_at_the_commit_in_the_trace_of_the_enqueue(spans, settings, live_server, api_key):
    """Remote mode: the task goes over REST when the transaction commits, after the view's span has
    ended, and still joins that span's trace; the server (here, this process) makes `valka.enqueue`."""
    from django.db import transaction
    from django.tasks import task_backends

    from tasks.models import Task
    from tests.sdk import django_tasks

    settings.TASKS = {**settings.TASKS, "remote": {
        "BACKEND": "valka_sdk.django.ValkaBackend", "QUEUES": ["emails"],
        "OPTIONS": {"URL": live_server.url, "API_KEY": api_key}}}
    assert task_backends["remote"].settings.url == live_server.url
    with transaction.atomic():
        with trace.get_tracer("the view").start_as_current_span("POST /orders") as view:
            result = django_tasks.send_receipt.using(backend="remote").enqueue(41)
        assert not Task.objects.filter(id=result.id).exists()
    enqueue, = [s for s in spans.get_finished_spans() if s.name == "valka.enqueue"]
    assert enqueue.parent.span_id == view.get_span_context().span_id
    assert enqueue.context.trace_id == view.get_span_context().trace_id
    carried = Task.objects.get(id=result.id).metadata[tracing.TRACEPARENT]
    assert carried.split("-")[2] == trace.format_span_id(enqueue.context.span_id)


@pytest.mark.django_db
def test_the_django_backend_in_process_enqueues_in_the_caller_s_trace(spans):
    """In-process mode (Valka's own project, no URL): `Task.enqueue()` is `valka.enqueue` in this
    process, so its span is the caller's child and the task carries it, beside the task's own metadata."""
    from tasks.models import Task
    from tests.sdk import django_tasks

    with trace.get_tracer("the view").start_as_current_span("POST /orders") as view:
        result = django_tasks.send_receipt.enqueue(41)
    enqueue, = [s for s in spans.get_finished_spans() if s.name == "valka.enqueue"]
    assert enqueue.kind == SpanKind.PRODUCER and enqueue.parent.span_id == view.get_span_context().span_id
    assert enqueue.attributes["messaging.message.id"] == result.id
    assert Task.objects.get(id=result.id).metadata == {
        "m": 1, tracing.TRACEPARENT: f"00-{trace.format_trace_id(enqueue.context.trace_id)}-"
                                     f"{trace.format_span_id(enqueue.context.span_id)}-{enqueue.context.trace_flags:02x}"}


def test_a_provider_set_later_is_seen_within_look_again(fresh_globals, monkeypatch):
    monkeypatch.setattr(tracing, "LOOK_AGAIN", 0.2)
    assert tracing.tracer() is None
    provider = TracerProvider()
    trace.set_tracer_provider(provider)
    assert tracing.tracer() is None, "the answer is kept for a while: asking costs a microsecond"
    deadline = time.monotonic() + 5
    while tracing.tracer() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tracing.tracer() is not None and tracing.enabled()
