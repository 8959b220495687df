"""One trace from the request that enqueues a task to every attempt that runs it, across real
processes: the web app, the dispatcher and an SDK worker export their spans to an OTLP collector
in the test (configured by the standard environment alone), and a worker that knows nothing of
tracing still runs tasks that carry a context."""

from __future__ import annotations

import json

import grpc
import httpx
import pytest

from tasks import services
from tasks.models import TaskRun
from tests.helpers import Raw, hello, wait_status
from valka_sdk.tracing import TRACEPARENT
from valka_sdk.v1 import api_pb2, api_pb2_grpc
from valka_sdk.v1 import worker_pb2 as pb

CALLER_TRACE, CALLER_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


def _named(spans: list[dict], name: str) -> list[dict]:
    return [s for s in spans if s["name"] == name]


@pytest.mark.slow
def test_a_rest_request_s_trace_holds_every_attempt(stack, collector):
    web = stack.web(OTEL_SERVICE_NAME="shop-api", **collector.env)
    _, addr = stack.dispatcher(VALKA_RETRY_BASE_DELAY="0.2", **collector.env)
    stack.scheduler(VALKA_SCHEDULER_MAX_SLEEP="0.2")
    stack.worker(addr, name="traced", **collector.env)
    response = httpx.post(f"{web}/api/v1/tasks", headers={"traceparent": CALLER},
                          json={"task_name": "fail_until", "queue": "default", "input": {"succeed_on": 2}})
    assert response.status_code == 201, response.text
    task_id = response.json()["id"]
    assert wait_status(task_id, "COMPLETED").attempt_count == 2

    runs = collector.wait(lambda spans: len(_named(spans, "valka.run fail_until")) == 2 and spans,
                          "both attempts' spans")
    (enqueue,) = _named(runs, "valka.enqueue")
    assert enqueue["service"] == "shop-api" and enqueue["kind"] == "PRODUCER"
    assert (enqueue["trace_id"], enqueue["parent_id"]) == (CALLER_TRACE, CALLER_SPAN)
    assert response.json()["metadata"][TRACEPARENT].split("-")[1:3] == [CALLER_TRACE, enqueue["span_id"]]
    first, second = sorted(_named(runs, "valka.run fail_until"), key=lambda s: s["attributes"]["valka.attempt"])
    rows = {r.attempt_number: r for r in TaskRun.objects.filter(task_id=task_id)}
    for attempt, run in ((1, first), (2, second)):
        assert (run["trace_id"], run["parent_id"], run["kind"]) == (CALLER_TRACE, enqueue["span_id"], "CONSUMER")
        assert run["service"] == "valka-worker"
        assert run["attributes"] | {"valka.worker": "any"} == {
            "messaging.system": "valka", "messaging.destination.name": "default",
            "messaging.operation.type": "process", "messaging.operation.name": "run",
            "messaging.message.id": task_id, "valka.task_name": "fail_until", "valka.attempt": attempt,
            "valka.run_id": str(rows[attempt].id), "valka.worker": "any", "valka.worker.name": "traced",
            **({"valka.retryable": True} if attempt == 1 else {})}
        assert run["attributes"]["valka.worker"] == rows[attempt].worker_id
    assert first["status"] == "ERROR" and second["status"] == "UNSET"
    assert [name for name, _ in first["events"]] == ["exception", "valka.retry"]
    assert first["events"][0][1]["exception.type"] == "RuntimeError"
    assert first["events"][0][1]["exception.message"] == "failing attempt 1"
    assert second["events"] == []
    claims = collector.wait(lambda spans: len(_named(spans, "valka.claim default")) >= 2 and spans, "the claims")
    for claim in _named(claims, "valka.claim default"):
        assert claim["service"] == "valka-dispatcher" and claim["parent_id"] == ""
        assert claim["trace_id"] != CALLER_TRACE, "a claim is linked to its tasks' traces, not a part of them"
        assert claim["links"] == [(CALLER_TRACE, enqueue["span_id"], {"messaging.message.id": task_id})]


def test_grpc_create_task_with_traceparent_and_a_worker_that_knows_nothing_of_tracing(stack, collector):
    _, addr = stack.dispatcher(**collector.env)
    with grpc.insecure_channel(addr) as channel:
        created = api_pb2_grpc.ApiServiceStub(channel).CreateTask(
            api_pb2.CreateTaskRequest(queue_name="raw", task_name="t", metadata='{"k": "v"}'),
            metadata=(("traceparent", CALLER),)).task
    (enqueue,) = collector.wait(lambda spans: _named(spans, "valka.enqueue"), "the enqueue span")
    assert (enqueue["trace_id"], enqueue["parent_id"], enqueue["service"]) == (
        CALLER_TRACE, CALLER_SPAN, "valka-dispatcher")
    carried = json.loads(created.metadata)
    assert carried["k"] == "v" and carried[TRACEPARENT].split("-")[1:3] == [CALLER_TRACE, enqueue["span_id"]]

    # A hand-written worker, which knows nothing of tracing: the keys are metadata like any other.
    raw = Raw(addr, [hello(queues=("raw",))])
    try:
        assignment = raw.next("task_assignment")
        assert json.loads(assignment.metadata) == carried
        raw.send(task_result=pb.TaskResult(task_id=assignment.task_id, task_run_id=assignment.task_run_id,
                                           success=True, output='{"ok": true}'))
        assert wait_status(created.id, "COMPLETED").output == {"ok": True}
    finally:
        raw.close()

    # The SDK worker with no tracer provider (no OTEL_* in its environment) runs one too.
    stack.worker(addr)
    task = services.task_enqueue(task_name="echo", queue="default", metadata={TRACEPARENT: CALLER})
    assert wait_status(task.id, "COMPLETED").output["echo"] is None
    assert not any(s["service"] == "valka-worker" for s in collector.spans())


def test_without_a_tracer_provider_a_context_passes_through_and_an_invalid_one_is_ignored(stack):
    """No process traces (no OTEL_* in their environment): a caller's context is stored as it came
    (no valka.enqueue span made it a parent), an invalid one is dropped and never refused, over REST
    and gRPC, and the SDK worker runs every task."""
    web = stack.web()
    _, addr = stack.dispatcher()
    stack.worker(addr)
    ids, stored = [], []
    for header in (CALLER, "00-garbage", "00-" + "0" * 32 + "-" + CALLER_SPAN + "-01"):
        response = httpx.post(f"{web}/api/v1/tasks", headers={"traceparent": header},
                              json={"task_name": "echo", "queue": "default"})
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
        stored.append(response.json()["metadata"])
    response = httpx.post(f"{web}/api/v1/tasks/batch", headers={"traceparent": "not-a-traceparent"},
                          json={"tasks": [{"task_name": "echo", "queue": "default"}]})
    assert response.status_code == 201, response.text
    ids.append(response.json()["results"][0]["task"]["id"])
    stored.append(response.json()["results"][0]["task"]["metadata"])
    with grpc.insecure_channel(addr) as channel:
        stub = api_pb2_grpc.ApiServiceStub(channel)
        for header in (CALLER, "00-garbage"):
            task = stub.CreateTask(api_pb2.CreateTaskRequest(queue_name="default", task_name="echo"),
                                   metadata=(("traceparent", header),)).task
            ids.append(task.id)
            stored.append(json.loads(task.metadata or "{}"))
    assert stored == [{TRACEPARENT: CALLER}, {}, {}, {}, {TRACEPARENT: CALLER}, {}]
    for task_id in ids:
        wait_status(task_id, "COMPLETED")
