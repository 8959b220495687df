"""Every way of creating a task stores its caller's trace context in the task's metadata
(tasks/tracing.py): the `valka.enqueue` span with a tracer provider, the context as it came
without one, nothing at all with neither."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

import valka
from tasks import services
from tasks.models import Task
from valka_sdk.tracing import TRACEPARENT, TRACESTATE

pytestmark = pytest.mark.django_db

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CALLER_TRACE, CALLER_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


def _traceparent(span) -> str:
    context = span.get_span_context()
    trace_id, span_id = trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)
    return f"00-{trace_id}-{span_id}-{context.trace_flags:02x}"


def _stored(task_id) -> dict:
    return Task.objects.get(id=task_id).metadata


def test_enqueue_inside_a_span_of_the_caller(spans):
    with trace.get_tracer("the caller").start_as_current_span("view") as view:
        task = valka.enqueue("send", queue="emails", metadata={"k": "v"})
    (enqueue,) = [s for s in spans.get_finished_spans() if s.name == "valka.enqueue"]
    assert enqueue.kind == SpanKind.PRODUCER
    assert enqueue.parent.span_id == view.get_span_context().span_id
    assert enqueue.context.trace_id == view.get_span_context().trace_id
    assert dict(enqueue.attributes) == {
        "messaging.system": "valka", "messaging.destination.name": "emails", "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue", "valka.task_name": "send", "messaging.message.id": str(task.id)}
    assert task.metadata == _stored(task.id) == {"k": "v", TRACEPARENT: _traceparent(enqueue)}


def test_no_tracer_provider_no_spans_no_context_and_nothing_stored():
    assert trace.get_current_span().get_span_context().is_valid is False
    task = valka.enqueue("send", metadata={"k": "v"})
    assert _stored(task.id) == {"k": "v"}
    batch = valka.enqueue_many([{"task_name": "a"}, {"task_name": "b", "metadata": {}}])
    assert [_stored(t.id) for t in batch] == [{}, {}]


def test_rest_create_with_a_traceparent_header(client_api, spans):
    response = client_api.post("/api/v1/tasks", {"task_name": "t", "queue": "q"}, format="json",
                               HTTP_TRACEPARENT=CALLER, HTTP_TRACESTATE="vendor=1")
    assert response.status_code == 201
    (enqueue,) = spans.get_finished_spans()
    assert trace.format_trace_id(enqueue.context.trace_id) == CALLER_TRACE
    assert trace.format_span_id(enqueue.parent.span_id) == CALLER_SPAN and enqueue.parent.is_remote
    carried = {TRACEPARENT: _traceparent(enqueue), TRACESTATE: "vendor=1"}
    assert response.json()["metadata"] == carried == _stored(response.json()["id"])
    assert client_api.get(f"/api/v1/tasks/{response.json()['id']}").json()["metadata"] == carried


def test_without_a_tracer_provider_the_request_context_is_stored_as_it_came(client_api):
    response = client_api.post("/api/v1/tasks", {"task_name": "t", "queue": "q", "metadata": {"a": [1]}},
                               format="json", HTTP_TRACEPARENT=CALLER)
    assert response.status_code == 201
    assert _stored(response.json()["id"]) == {"a": [1], TRACEPARENT: CALLER}


@pytest.mark.parametrize("header", ["00-not-a-trace", "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                                    "zz" * 300])
def test_an_invalid_traceparent_is_ignored(client_api, spans, header):
    response = client_api.post("/api/v1/tasks", {"task_name": "t", "queue": "q"}, format="json",
                               HTTP_TRACEPARENT=header)
    assert response.status_code == 201, response.content
    (enqueue,) = spans.get_finished_spans()
    assert enqueue.parent is None, "a new root trace"
    assert _stored(response.json()["id"]) == {TRACEPARENT: _traceparent(enqueue)}


def test_an_invalid_traceparent_without_a_tracer_provider_stores_nothing(client_api):
    response = client_api.post("/api/v1/tasks", {"task_name": "t", "queue": "q"}, format="json",
                               HTTP_TRACEPARENT="00-garbage")
    assert response.status_code == 201
    assert _stored(response.json()["id"]) == {}


def test_a_batch_is_one_span_and_a_caller_s_own_context_wins(client_api, spans):
    own = "00-11111111111111111111111111111111-2222222222222222-01"
    items = [{"task_name": "t", "queue": "q", "metadata": {"n": n}} for n in range(3)]
    items.append({"task_name": "t", "queue": "q", "metadata": {TRACEPARENT: own}})
    items.append({"task_name": "t"})  # invalid: no queue
    response = client_api.post("/api/v1/tasks/batch", {"tasks": items}, format="json", HTTP_TRACEPARENT=CALLER)
    assert response.status_code == 201
    (enqueue,) = spans.get_finished_spans()
    assert enqueue.attributes["messaging.batch.message_count"] == 4
    assert "messaging.message.id" not in enqueue.attributes
    ids = [result["task"]["id"] for result in response.json()["results"][:4]]
    assert [_stored(i) for i in ids] == [{"n": n, TRACEPARENT: _traceparent(enqueue)} for n in range(3)] + [
        {TRACEPARENT: own}]


def test_a_span_made_by_an_instrumentation_of_the_server_is_the_parent(client_api, spans):
    """With a server span current (as opentelemetry-instrument's Django middleware makes), the header is
    not read again: that span is its child already."""
    with trace.get_tracer("instrumentation").start_as_current_span("POST /api/v1/tasks") as server:
        response = client_api.post("/api/v1/tasks", {"task_name": "t", "queue": "q"}, format="json",
                                   HTTP_TRACEPARENT=CALLER)
    enqueue = next(s for s in spans.get_finished_spans() if s.name == "valka.enqueue")
    assert enqueue.parent.span_id == server.get_span_context().span_id
    assert _stored(response.json()["id"])[TRACEPARENT] == _traceparent(enqueue)


def test_an_existing_idempotency_key_answers_the_first_task_and_its_context(spans):
    with trace.get_tracer("caller").start_as_current_span("first"):
        first = services.task_enqueue(task_name="t", queue="q", idempotency_key="k")
    with trace.get_tracer("caller").start_as_current_span("second"):
        again = services.task_enqueue(task_name="t", queue="q", idempotency_key="k")
    assert again.id == first.id and again.metadata == first.metadata
    second = [s for s in spans.get_finished_spans() if s.name == "valka.enqueue"][1]
    assert second.attributes["valka.existing"] is True


def test_a_replay_keeps_the_original_s_context(client_api):
    task = services.task_enqueue(task_name="t", queue="q", metadata={TRACEPARENT: CALLER})
    Task.objects.filter(id=task.id).update(status="FAILED", finished_at=task.created_at)
    replay = services.task_replay(task_id=task.id)
    assert _stored(replay.id) == {TRACEPARENT: CALLER}
