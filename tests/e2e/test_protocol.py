"""The valka.v1 protocol as other clients see it: raw gRPC, no SDK."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tasks import services
from tasks.models import Task, TaskRun
from tests.helpers import ROOT, Feeder, wait_for, wait_status
from valka_sdk.v1 import api_pb2, api_pb2_grpc, common_pb2, events_pb2, worker_pb2_grpc
from valka_sdk.v1 import worker_pb2 as pb


def _session(addr, requests, metadata=None):
    channel = grpc.insecure_channel(addr)
    stub = worker_pb2_grpc.WorkerServiceStub(channel)
    return channel, stub.Session(iter(requests), metadata=metadata)


def _hello(queues=("default",), worker_id="", concurrency=1):
    return pb.WorkerRequest(hello=pb.WorkerHello(worker_id=worker_id, worker_name="raw", queues=list(queues),
                                                 concurrency=concurrency))


def _status_of_call(call):
    with pytest.raises(grpc.RpcError) as err:
        for _ in call:
            pass
    return err.value.code(), err.value.details()


def test_stream_without_hello_is_refused_and_others_keep_working(stack):
    _, addr = stack.dispatcher()
    channel, call = _session(addr, [pb.WorkerRequest(heartbeat=pb.Heartbeat(active_task_ids=[]))])
    code, details = _status_of_call(call)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "hello" in details
    channel.close()
    channel, call = _session(addr, [_hello(queues=())])
    code, details = _status_of_call(call)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "queues" in details
    channel.close()
    stack.worker(addr)
    task = services.task_enqueue(task_name="echo", queue="default")
    wait_status(task.id, "COMPLETED")


def test_garbage_and_huge_messages(stack):
    _, addr = stack.dispatcher()
    channel = grpc.insecure_channel(addr)
    raw = channel.stream_stream("/valka.v1.WorkerService/Session", request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    code, _ = _status_of_call(raw(iter([b"\xff\xfe garbage \x00\x01"])))
    assert code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNKNOWN)
    huge = pb.WorkerRequest(hello=pb.WorkerHello(queues=["default"], metadata="x" * (20 * 1024 * 1024)))
    code, _ = _status_of_call(raw(iter([huge.SerializeToString()])))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    channel.close()
    stack.worker(addr)
    task = services.task_enqueue(task_name="echo", queue="default")
    wait_status(task.id, "COMPLETED")


def test_raw_client_session_results_heartbeats_and_foreign_ids(stack):
    """A client written against the protocol table: assignment fields, heartbeat_ack, results for
    runs it does not hold and heartbeats for other workers' tasks change nothing."""
    _, addr = stack.dispatcher()
    other = services.task_enqueue(task_name="other", queue="elsewhere")
    task = services.task_enqueue(task_name="raw_task", queue="raw", input={"n": 1}, metadata={"m": 2},
                                 timeout_seconds=77)
    feeder = Feeder([_hello(queues=["raw"], worker_id="raw-1")])
    channel, call = _session(addr, feeder)
    a = next(call).task_assignment
    assert (a.task_id, a.queue_name, a.task_name, a.attempt_number, a.timeout_seconds) == (
        str(task.id), "raw", "raw_task", 1, 77)
    assert json.loads(a.input) == {"n": 1} and json.loads(a.metadata) == {"m": 2}
    uuid.UUID(a.task_run_id)
    run = wait_for(lambda: TaskRun.objects.filter(id=a.task_run_id).first(), what="run row")
    lease = run.lease_expires_at
    # A heartbeat naming our task and someone else's: only ours is extended.
    feeder.put(pb.WorkerRequest(heartbeat=pb.Heartbeat(active_task_ids=[a.task_id, str(other.id), "junk"])))
    ack = next(call)
    assert ack.WhichOneof("response") == "heartbeat_ack" and ack.heartbeat_ack.server_timestamp_ms > 0
    wait_for(lambda: TaskRun.objects.get(id=a.task_run_id).last_heartbeat_at > run.started_at, what="heartbeat")
    assert TaskRun.objects.get(id=a.task_run_id).lease_expires_at >= lease
    # Results for runs this worker does not hold.
    feeder.put(pb.WorkerRequest(task_result=pb.TaskResult(task_id=str(other.id), task_run_id=str(uuid.uuid4()),
                                                          success=True, output="{}")))
    feeder.put(pb.WorkerRequest(task_result=pb.TaskResult(task_id="x", task_run_id="not-a-uuid", success=True)))
    # A success with retryable set (ignored), and a log batch.
    feeder.put(pb.WorkerRequest(log_batch=pb.LogBatch(entries=[pb.LogEntry(
        task_run_id=a.task_run_id, timestamp_ms=1, level=common_pb2.LOG_LEVEL_WARN, message="hi\x00there",
        metadata="not json")])))
    feeder.put(pb.WorkerRequest(task_result=pb.TaskResult(task_id=a.task_id, task_run_id=a.task_run_id,
                                                          success=True, retryable=True, output='{"ok": 1}')))
    done = wait_status(task.id, "COMPLETED")
    assert done.output == {"ok": 1}
    assert Task.objects.get(id=other.id).status == "PENDING"
    line = wait_for(lambda: run.logs.first(), what="log line")
    assert line.level == "WARN" and line.message == "hithere" and line.metadata is None
    # A duplicate result for the finished run changes nothing.
    feeder.put(pb.WorkerRequest(task_result=pb.TaskResult(task_id=a.task_id, task_run_id=a.task_run_id,
                                                          success=False, error_message="late")))
    feeder.put(pb.WorkerRequest(heartbeat=pb.Heartbeat()))
    assert next(call).WhichOneof("response") == "heartbeat_ack"
    assert Task.objects.get(id=task.id).status == "COMPLETED"
    feeder.close()
    call.cancel()
    channel.close()


def test_worker_token(stack):
    _, addr = stack.dispatcher(VALKA_WORKER_TOKEN="s3cret")
    channel, call = _session(addr, [_hello()])
    code, _ = _status_of_call(call)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    channel.close()
    channel, call = _session(addr, [_hello()], metadata=(("authorization", "Bearer wrong"),))
    assert _status_of_call(call)[0] == grpc.StatusCode.UNAUTHENTICATED
    channel.close()
    stack.worker(addr, VALKA_TEST_TOKEN="s3cret")
    task = services.task_enqueue(task_name="echo", queue="default")
    wait_status(task.id, "COMPLETED")


def test_api_service(stack):
    _, addr = stack.dispatcher()
    with grpc.insecure_channel(addr) as channel:
        api = api_pb2_grpc.ApiServiceStub(channel)
        created = api.CreateTask(api_pb2.CreateTaskRequest(
            queue_name="grpc", task_name="t", input='{"a": 1}', priority=3, idempotency_key="g-1",
            metadata='{"k": "v"}', scheduled_at="2031-01-01T00:00:00Z")).task
        assert created.status == common_pb2.TASK_STATUS_PENDING
        assert (created.max_retries, created.timeout_seconds) == (3, 300), "0 means the default"
        assert json.loads(created.input) == {"a": 1} and created.scheduled_at.startswith("2031-01-01T00:00:00")
        again = api.CreateTask(api_pb2.CreateTaskRequest(queue_name="grpc", task_name="t", idempotency_key="g-1"))
        assert again.task.id == created.id
        assert api.GetTask(api_pb2.GetTaskRequest(task_id=created.id)).task.task_name == "t"
        for _ in range(3):
            api.CreateTask(api_pb2.CreateTaskRequest(queue_name="grpc", task_name="more"))
        page = api.ListTasks(api_pb2.ListTasksRequest(queue_name="grpc", pagination=common_pb2.Pagination(
            page_size=3)))
        assert len(page.tasks) == 3 and page.next_page_token
        rest = api.ListTasks(api_pb2.ListTasksRequest(queue_name="grpc", pagination=common_pb2.Pagination(
            page_size=3, page_token=page.next_page_token)))
        assert len(rest.tasks) == 1 and rest.next_page_token == ""
        pending = api.ListTasks(api_pb2.ListTasksRequest(status=common_pb2.TASK_STATUS_PENDING))
        assert len(pending.tasks) == 4
        cancelled = api.CancelTask(api_pb2.CancelTaskRequest(task_id=created.id)).task
        assert cancelled.status == common_pb2.TASK_STATUS_CANCELLED
        for call, code in [
            (lambda: api.CancelTask(api_pb2.CancelTaskRequest(task_id=created.id)),
             grpc.StatusCode.FAILED_PRECONDITION),
            (lambda: api.GetTask(api_pb2.GetTaskRequest(task_id=str(uuid.uuid4()))), grpc.StatusCode.NOT_FOUND),
            (lambda: api.GetTask(api_pb2.GetTaskRequest(task_id="nope")), grpc.StatusCode.NOT_FOUND),
            (lambda: api.CreateTask(api_pb2.CreateTaskRequest(task_name="t")), grpc.StatusCode.INVALID_ARGUMENT),
            (lambda: api.CreateTask(api_pb2.CreateTaskRequest(queue_name="q", task_name="t", input="{bad")),
             grpc.StatusCode.INVALID_ARGUMENT),
        ]:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == code
        with pytest.raises(grpc.RpcError) as err:
            api.CreateTask(api_pb2.CreateTaskRequest(queue_name="bad queue", task_name="t"))
        assert "queue" in err.value.details()
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "valka.v1.WorkerService", "valka.v1.ApiService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_create_task_takes_a_concurrency_key_in_its_metadata(stack):
    _, addr = stack.dispatcher()
    with grpc.insecure_channel(addr) as channel:
        api = api_pb2_grpc.ApiServiceStub(channel)
        created = api.CreateTask(api_pb2.CreateTaskRequest(
            queue_name="keyed", task_name="t", metadata=json.dumps({"valka.concurrency_key": "c-7", "m": 1}))).task
        assert json.loads(created.metadata) == {"valka.concurrency_key": "c-7", "m": 1}
        row = Task.objects.get(id=created.id)
        assert (row.concurrency_key, row.metadata) == ("c-7", {"m": 1}), "the key is a column, not metadata"
        got = api.GetTask(api_pb2.GetTaskRequest(task_id=created.id)).task
        assert json.loads(got.metadata)["valka.concurrency_key"] == "c-7"
        for bad in ("k" * 201, "a\x00b", 42):
            with pytest.raises(grpc.RpcError) as err:
                api.CreateTask(api_pb2.CreateTaskRequest(
                    queue_name="keyed", task_name="t", metadata=json.dumps({"valka.concurrency_key": bad})))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "concurrency_key" in err.value.details()
    assert Task.objects.count() == 1


def test_server_reflection_lists_the_services(stack):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    _, addr = stack.dispatcher()
    with grpc.insecure_channel(addr) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        answer = next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
        names = {s.name for s in answer.list_services_response.service}
        assert {"valka.v1.WorkerService", "valka.v1.ApiService", "grpc.health.v1.Health"} <= names


def test_generated_code_is_fresh(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts/generate_proto.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    generated = sorted(tmp_path.iterdir())
    committed = ROOT / "sdk/valka_sdk/v1"
    assert {p.name for p in generated} == {p.name for p in committed.glob("*_pb2*")}
    for path in generated:
        stale = committed / path.name
        assert stale.read_bytes() == path.read_bytes(), f"{stale} is stale: run `make proto`"


def test_generated_code_keeps_the_wire_names():
    """The code lives in `valka_sdk.v1`; the protocol it speaks is still `valka.v1`."""
    assert common_pb2.DESCRIPTOR.name == "valka/v1/common.proto" and common_pb2.DESCRIPTOR.package == "valka.v1"
    assert pb.DESCRIPTOR.services_by_name["WorkerService"].full_name == "valka.v1.WorkerService"
    assert pb.TaskResult.__module__ == "valka_sdk.v1.worker_pb2"


def _protocol_table() -> dict[tuple[str, str], int]:
    shared = ROOT.parent / "shared/protocol/valka-v1.md"
    doc = (shared if shared.exists() else ROOT / "proto/valka-v1.md").read_text()
    fields, message = {}, None
    for line in doc.splitlines():
        m = re.match(r"^\|\s*(.*?)\s*\|\s*(\w+)\s*\|\s*(\d+)\s*\|", line)
        if not m:
            continue
        name = m.group(1).strip()
        if name:
            message = name.split(" ")[0]
        fields[(message, m.group(2))] = int(m.group(3))
    return fields


def test_field_numbers_match_the_protocol_table():
    table = _protocol_table()
    assert len(table) > 80
    descriptors = {}
    for module in (common_pb2, pb, events_pb2, api_pb2):
        descriptors.update(module.DESCRIPTOR.message_types_by_name)
    ours = {(m, f.name): f.number for m, d in descriptors.items() for f in d.fields}
    assert ours == table
    assert [v.number for v in common_pb2.TaskStatus.DESCRIPTOR.values] == list(range(9))
    assert pb.WorkerRequest.DESCRIPTOR.oneofs_by_name["request"]
    assert pb.WorkerResponse.DESCRIPTOR.oneofs_by_name["response"]
    assert [m.name for m in api_pb2.DESCRIPTOR.services_by_name["ApiService"].methods] == [
        "CreateTask", "GetTask", "ListTasks", "CancelTask", "SendSignal", "SubscribeEvents", "SubscribeLogs"]
