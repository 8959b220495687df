"""Abuse of the gRPC protocol: malformed and oversized messages, streams without a hello, results,
heartbeats, logs and acks for tasks a worker does not hold, huge log batches, and edge inputs to
ApiService. The dispatcher answers each with a clear status and keeps serving everyone else:
after every abuse a normal SDK worker still completes a task.
"""

from __future__ import annotations

import json
import time
import uuid

import grpc
import pytest

from signals.models import Signal
from signals.services import signal_send
from tasks import services
from tasks.models import Task, TaskLog, TaskRun
from tests.helpers import MiB, Raw, hello, wait_for, wait_status
from valka_sdk.v1 import api_pb2, api_pb2_grpc, common_pb2
from valka_sdk.v1 import worker_pb2 as pb

SESSION = "/valka.v1.WorkerService/Session"


def final_status(call) -> tuple[grpc.StatusCode, str]:
    """Drain a call and return how it ended."""
    try:
        for _ in call:
            pass
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return call.code(), call.details() or ""


@pytest.fixture
def served(stack):
    """A dispatcher with one SDK worker on `default`; `served.check()` proves it still works. Its runs
    keep their whole logs: the limits per run (tests/e2e/test_message_limits.py) are not the point here."""
    _, addr = stack.dispatcher(VALKA_RUN_LOG_MAX_LINES="1000000", VALKA_RUN_LOG_MAX_BYTES=str(1 << 30))
    stack.worker(addr, queues="default", name="sdk")

    class Served:
        def __init__(self) -> None:
            self.addr = addr

        def check(self, what: str) -> None:
            task = services.task_enqueue(task_name="echo", queue="default", input={"after": what})
            done = wait_status(task.id, "COMPLETED", "FAILED", timeout=30)
            assert done.status == "COMPLETED" and done.output["echo"] == {"after": what}, what

    return Served()


def raw_bytes_call(addr: str, chunks: list[bytes]):
    channel = grpc.insecure_channel(addr)
    stub = channel.stream_stream(SESSION, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    return channel, stub(iter(chunks))


def test_malformed_streams_get_clear_statuses(served):
    addr = served.addr
    cases = [
        ("garbage after a valid hello", [hello().SerializeToString(), b"\xff\xff\xff\xff garbage"],
         {grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNKNOWN}, ""),
        ("no hello: a result first", [pb.WorkerRequest(task_result=pb.TaskResult(
            task_id=str(uuid.uuid4()), task_run_id=str(uuid.uuid4()), success=True)).SerializeToString()],
         {grpc.StatusCode.FAILED_PRECONDITION}, "hello"),
        ("no hello: an empty message", [pb.WorkerRequest().SerializeToString()],
         {grpc.StatusCode.FAILED_PRECONDITION}, "hello"),
        ("negative concurrency", [hello(concurrency=-1).SerializeToString()],
         {grpc.StatusCode.INVALID_ARGUMENT}, "concurrency"),
        ("too many queues", [hello(queues=[f"q{i}" for i in range(101)]).SerializeToString()],
         {grpc.StatusCode.INVALID_ARGUMENT}, "queues"),
        ("queue name too long", [hello(queues=["q" * 256]).SerializeToString()],
         {grpc.StatusCode.INVALID_ARGUMENT}, "queues"),
        ("worker id too long", [hello(worker_id="w" * 256).SerializeToString()],
         {grpc.StatusCode.INVALID_ARGUMENT}, "worker_id"),
        ("NUL in a queue name", [hello(queues=["a\x00b"]).SerializeToString()],
         {grpc.StatusCode.INVALID_ARGUMENT}, "queues"),
        ("NUL in the worker id", [hello(worker_id="w\x00").SerializeToString()],
         {grpc.StatusCode.INVALID_ARGUMENT}, "worker_id"),
        ("NUL in the worker name", [hello(name="n\x00").SerializeToString()],
         {grpc.StatusCode.INVALID_ARGUMENT}, "worker_name"),
    ]
    for what, chunks, codes, word in cases:
        channel, call = raw_bytes_call(addr, chunks)
        code, details = final_status(call)
        channel.close()
        assert code in codes, (what, code, details)
        assert word in details, (what, details)
    # A stream that says nothing and hangs up ends at once, without an error.
    channel, call = raw_bytes_call(addr, [])
    assert final_status(call)[0] == grpc.StatusCode.OK
    channel.close()
    served.check("malformed streams")


def test_a_second_hello_and_empty_messages_are_ignored(served):
    task = services.task_enqueue(task_name="raw", queue="raw")
    raw = Raw(served.addr, [hello(worker_id="twice")])
    assignment = raw.next("task_assignment")
    raw.send(hello=pb.WorkerHello(worker_id="someone-else", queues=["default"], concurrency=50))
    raw.feeder.put(pb.WorkerRequest())
    raw.ack()
    raw.send(task_result=pb.TaskResult(task_id=assignment.task_id, task_run_id=assignment.task_run_id,
                                       success=True, output='{"ok": true}'))
    assert wait_status(task.id, "COMPLETED").output == {"ok": True}
    assert TaskRun.objects.get(id=assignment.task_run_id).worker_id == "twice"
    raw.close()
    served.check("second hello")


def test_oversized_messages_end_the_stream_and_release_its_task(served):
    # Over the 16 MiB limit before any hello.
    channel, call = raw_bytes_call(served.addr, [hello(metadata="x" * (17 * MiB)).SerializeToString()])
    assert final_status(call)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    channel.close()
    # Over the limit in the middle of a session that holds a task: the session ends, the task is released.
    task = services.task_enqueue(task_name="raw", queue="raw", max_retries=0)
    raw = Raw(served.addr, [hello(worker_id="big")])
    assignment = raw.next("task_assignment")
    raw.send(log_batch=pb.LogBatch(entries=[pb.LogEntry(task_run_id=assignment.task_run_id, message="x" * (17 * MiB))]))
    code, details = final_status(raw.call)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    raw.close()
    run = wait_for(lambda: TaskRun.objects.filter(id=assignment.task_run_id, status="LOST").first(),
                   what="the lost run")
    assert run.error_message == "worker disconnected"
    assert wait_status(task.id, "DEAD_LETTER").attempt_count == 1
    assert not TaskLog.objects.filter(run_id=assignment.task_run_id).exists()
    served.check("oversized messages")


def test_huge_log_batches(served):
    task = services.task_enqueue(task_name="raw", queue="raw")
    raw = Raw(served.addr, [hello(worker_id="chatty")])
    a = raw.next("task_assignment")
    # 50,000 small entries in one batch.
    raw.send(log_batch=pb.LogBatch(entries=[
        pb.LogEntry(task_run_id=a.task_run_id, timestamp_ms=1_700_000_000_000 + i, level=common_pb2.LOG_LEVEL_INFO,
                    message=f"line {i}") for i in range(50_000)]))
    started = time.monotonic()
    raw.ack()
    assert time.monotonic() - started < 30, "the dispatcher kept reading while it wrote the batch"
    served.check("a batch of 50,000 log lines")
    wait_for(lambda: TaskLog.objects.filter(run_id=a.task_run_id).count() == 50_000, 60, what="50,000 lines")
    first, last = TaskLog.objects.filter(run_id=a.task_run_id).order_by("id")[::49_999]
    assert (first.message, last.message) == ("line 0", "line 49999")
    # About 15 MiB in one batch, under the 16 MiB message limit: 240 lines of 64 KiB.
    raw.send(log_batch=pb.LogBatch(entries=[
        pb.LogEntry(task_run_id=a.task_run_id, message=chr(65 + i % 26) * (64 * 1024)) for i in range(240)]))
    raw.ack()
    served.check("a 15 MiB log batch")
    wait_for(lambda: TaskLog.objects.filter(run_id=a.task_run_id).count() == 50_240, 60, what="the big lines")
    # A line over 64 KiB is cut, not refused.
    raw.send(log_batch=pb.LogBatch(entries=[pb.LogEntry(task_run_id=a.task_run_id, message="z" * (1 * MiB))]))
    raw.send(task_result=pb.TaskResult(task_id=a.task_id, task_run_id=a.task_run_id, success=True, output="1"))
    assert wait_status(task.id, "COMPLETED").output == 1
    line = wait_for(lambda: TaskLog.objects.filter(run_id=a.task_run_id, message__startswith="z").first(),
                    what="the long line")
    assert len(line.message) == 64 * 1024
    raw.close()
    served.check("huge log batches")


def test_a_worker_cannot_touch_tasks_it_does_not_hold(served):
    """B sends results, heartbeats, logs and signal acks for the task A runs: none of it lands."""
    task = services.task_enqueue(task_name="raw", queue="held", timeout_seconds=600)
    a = Raw(served.addr, [hello(queues=["held"], worker_id="holder")])
    assignment = a.next("task_assignment")
    run = wait_for(lambda: TaskRun.objects.filter(id=assignment.task_run_id).first(), what="A's run")
    b = Raw(served.addr, [hello(queues=["other"], worker_id="intruder")])
    b.ack()
    signal, _ = signal_send(task_id=task.id, signal_type="ping", wait=0)
    wait_for(lambda: Signal.objects.get(id=signal.id).status == "DELIVERED", what="the signal delivered to A")
    time.sleep(1.1)  # so a heartbeat that landed would move last_heartbeat_at visibly
    b.send(heartbeat=pb.Heartbeat(active_task_ids=[assignment.task_id]))
    b.send(log_batch=pb.LogBatch(entries=[pb.LogEntry(task_run_id=assignment.task_run_id, message="forged")]))
    b.send(signal_ack=pb.SignalAck(signal_id=str(signal.id)))
    for success in (True, False):
        b.send(task_result=pb.TaskResult(task_id=assignment.task_id, task_run_id=assignment.task_run_id,
                                         success=success, retryable=False, output='"forged"',
                                         error_message="forged"))
    b.ack()
    # Let the dispatcher's writer run its pass over what B sent.
    served.check("an intruder's messages")
    current = TaskRun.objects.get(id=run.id)
    assert (current.status, current.last_heartbeat_at, current.lease_expires_at) == (
        "RUNNING", run.last_heartbeat_at, run.lease_expires_at)
    assert Task.objects.get(id=task.id).status == "RUNNING"
    assert not TaskLog.objects.filter(run_id=run.id, message="forged").exists()
    assert Signal.objects.get(id=signal.id).status == "DELIVERED"
    # The holder's own messages still count.
    a.send(signal_ack=pb.SignalAck(signal_id=str(signal.id)))
    a.send(task_result=pb.TaskResult(task_id=assignment.task_id, task_run_id=assignment.task_run_id,
                                     success=True, output='"mine"'))
    assert wait_status(task.id, "COMPLETED").output == "mine"
    wait_for(lambda: Signal.objects.get(id=signal.id).status == "ACKNOWLEDGED", what="A's ack")
    a.close()
    b.close()
    served.check("results for tasks not held")


def test_worker_outputs_that_cannot_be_stored_fail_the_task(served):
    """Each of these once reached PostgreSQL, which refused it and with it the writer's whole batch,
    again and again: no result, start or heartbeat of any worker was written any more."""
    outputs = {"not json": "{nope", "NaN": "NaN", "Infinity": '{"x": -Infinity}', "NUL": '"\\u0000"',
               "huge number": "1e999999", "tiny number": "0.0e-99999", "lone surrogate": '["\\ud800"]',
               "too deep for Python": "[" * 5000 + "]" * 5000, "over 100 levels": "[" * 101 + "]" * 101}
    tasks = {what: services.task_enqueue(task_name="raw", queue="outputs", max_retries=0) for what in outputs}
    raw = Raw(served.addr, [hello(queues=["outputs"], worker_id="outputs", concurrency=len(outputs))])
    assignments = [raw.next("task_assignment") for _ in outputs]
    by_task = {a.task_id: a for a in assignments}
    # Log metadata PostgreSQL would refuse is dropped, the line kept.
    first = assignments[0]
    raw.send(log_batch=pb.LogBatch(entries=[pb.LogEntry(task_run_id=first.task_run_id, message=f"m{i}",
                                                        metadata=bad) for i, bad in enumerate(outputs.values())]))
    for what, output in outputs.items():
        a = by_task[str(tasks[what].id)]
        raw.send(task_result=pb.TaskResult(task_id=a.task_id, task_run_id=a.task_run_id, success=True,
                                           output=output))
    for what, task in tasks.items():
        done = wait_status(task.id, "COMPLETED", "FAILED")
        assert done.status == "FAILED" and "JSON" in done.error_message, (what, done.status, done.output)
    lines = wait_for(lambda: list(TaskLog.objects.filter(run_id=first.task_run_id)), what="the log lines")
    assert len(lines) == len(outputs) and all(line.metadata is None for line in lines)
    raw.close()
    served.check("bad outputs")


def test_api_service_edge_inputs(served):
    with grpc.insecure_channel(served.addr, options=[("grpc.max_send_message_length", 64 * MiB)]) as channel:
        api = api_pb2_grpc.ApiServiceStub(channel)

        def create(**fields):
            return api.CreateTask(api_pb2.CreateTaskRequest(**{"queue_name": "grpc-edge", "task_name": "t",
                                                                 **fields})).task

        def refused(call, code, word):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == code, err.value.details()
            assert word in err.value.details(), err.value.details()

        text = "Grüße 🚀 日本語 \u2028 \\ ' \" $$ %s"
        task = create(task_name=text, idempotency_key=text, input=json.dumps({text: text}),
                      metadata=json.dumps({"m": text}), priority=2**31 - 1)
        stored = Task.objects.get(id=task.id)
        assert (stored.task_name, stored.idempotency_key, stored.input, stored.metadata, stored.priority) == (
            text, text, {text: text}, {"m": text}, 2**31 - 1)
        assert json.loads(api.GetTask(api_pb2.GetTaskRequest(task_id=task.id)).task.input) == {text: text}
        assert create(priority=-(2**31)).priority == -(2**31)
        assert create(scheduled_at="0001-01-01T00:00:00Z").scheduled_at.startswith("0001-01-01T00:00:00")
        assert create(scheduled_at="9999-12-31T23:59:59Z").scheduled_at.startswith("9999-12-31T23:59:59")
        count = Task.objects.count()
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        refused(lambda: create(task_name="a\x00b"), invalid, "task_name")
        refused(lambda: create(idempotency_key="k\x00"), invalid, "idempotency_key")
        refused(lambda: create(input='"\\u0000"'), invalid, "input")
        refused(lambda: create(input="[" * 10_000 + "]" * 10_000), invalid, "input")
        refused(lambda: create(metadata='{"m": ' + "[" * 200 + "]" * 200 + "}"), invalid, "metadata")
        refused(lambda: create(input='"' + "x" * MiB + '"'), invalid, "PAYLOAD_TOO_LARGE")
        refused(lambda: create(queue_name="x'; DROP TABLE tasks; --"), invalid, "queue")
        refused(lambda: create(scheduled_at="0001-01-01T00:00:00+01:00"), invalid, "run_at")
        refused(lambda: create(scheduled_at="2030-01-01T00:00:00"), invalid, "run_at")
        assert Task.objects.count() == count
        assert create(input='"' + "x" * (MiB - 2) + '"').input == '"' + "x" * (MiB - 2) + '"'
        # Bad ids and page tokens.
        for bad in ["", "nope", "\x00", "1" * 1000]:
            refused(lambda bad=bad: api.GetTask(api_pb2.GetTaskRequest(task_id=bad)), grpc.StatusCode.NOT_FOUND, "")
        for token in ["-1", "abc", "9" * 30, str(2**63)]:
            refused(lambda token=token: api.ListTasks(api_pb2.ListTasksRequest(
                pagination=common_pb2.Pagination(page_token=token))), invalid, "page_token")
        running = services.task_enqueue(task_name="raw", queue="nobody-serves-this")
        refused(lambda: api.SendSignal(api_pb2.SendSignalRequest(task_id=str(running.id), signal_name="a\x00")),
                invalid, "signal_type")
        refused(lambda: api.SendSignal(api_pb2.SendSignalRequest(task_id=str(running.id), signal_name="s",
                                                                 payload="[" * 5000)), invalid, "payload")
        assert not Signal.objects.exists()
    served.check("ApiService edge inputs")
