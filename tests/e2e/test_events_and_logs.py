"""Live feeds: SSE events and log tails from the web app, SubscribeEvents/SubscribeLogs over gRPC."""

from __future__ import annotations

import json
import queue
import threading

import grpc
import httpx
import pytest

from tasks import services
from tasks.models import TaskRun
from tests.helpers import wait_for, wait_status
from valka_sdk.v1 import api_pb2, api_pb2_grpc, common_pb2


def _sse_reader(url: str, sink: queue.Queue, stop: threading.Event) -> None:
    try:
        _read_sse(url, sink, stop)
    except httpx.HTTPError:
        pass  # the server went away at the end of the test


def _read_sse(url: str, sink: queue.Queue, stop: threading.Event) -> None:
    with httpx.Client(timeout=httpx.Timeout(30, read=30)) as client, client.stream("GET", url) as r:
        sink.put(("status", r.status_code))
        event = None
        for line in r.iter_lines():
            if stop.is_set():
                return
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                sink.put((event, json.loads(line[6:])))
            elif line == ": connected":
                sink.put(("connected", None))


def _collect(sink: queue.Queue, until, timeout=45.0):
    got = []
    deadline = threading.Event()
    timer = threading.Timer(timeout, deadline.set)
    timer.start()
    try:
        while not deadline.is_set():
            try:
                item = sink.get(timeout=0.2)
            except queue.Empty:
                continue
            got.append(item)
            if until(got):
                return got
        raise AssertionError(f"timed out; got {got}")
    finally:
        timer.cancel()


def test_sse_events_follow_a_task_through_its_life(stack):
    web = stack.web()
    _, addr = stack.dispatcher()
    stack.worker(addr, queues="watched,not-watched")
    sink: queue.Queue = queue.Queue()
    stop = threading.Event()
    threading.Thread(target=_sse_reader, args=(f"{web}/api/v1/events?queue=watched", sink, stop),
                     daemon=True).start()
    _collect(sink, lambda got: ("connected", None) in got)
    other = services.task_enqueue(task_name="echo", queue="not-watched")
    task = services.task_enqueue(task_name="echo", queue="watched", input={"x": 1})
    got = _collect(sink, lambda got: any(e == "task" and d["new_status"] == "COMPLETED" for e, d in got))
    stop.set()
    events = [d for e, d in got if e == "task"]
    assert {d["task_id"] for d in events} == {str(task.id)}, "the queue filter keeps other queues out"
    assert [(d["previous_status"], d["new_status"]) for d in events] == [
        (None, "PENDING"), ("PENDING", "DISPATCHING"), ("DISPATCHING", "RUNNING"), ("RUNNING", "COMPLETED")]
    running = events[2]
    run = TaskRun.objects.get(task_id=task.id)
    assert running["worker_id"] == run.worker_id and running["attempt_number"] == 1 and running["node_id"]
    assert all(d["event_id"] and d["timestamp_ms"] > 0 for d in events)
    wait_status(other.id, "COMPLETED")


def test_sse_events_start_with_the_response(stack):
    """A client that counts itself connected once the response starts (as a browser's EventSource
    does) misses nothing changed after that, on a web process that has not listened before."""
    web = stack.web()
    sink: queue.Queue = queue.Queue()
    stop = threading.Event()
    threading.Thread(target=_sse_reader, args=(f"{web}/api/v1/events?queue=early", sink, stop),
                     daemon=True).start()
    assert _collect(sink, lambda got: got)[0] == ("status", 200)
    task = services.task_enqueue(task_name="t", queue="early")
    got = _collect(sink, lambda got: any(e == "task" for e, _ in got))
    stop.set()
    assert [d["task_id"] for e, d in got if e == "task"] == [str(task.id)]


def test_sse_requires_access(stack):
    web = stack.web(VALKA_API_ANONYMOUS="false")
    r = httpx.get(f"{web}/api/v1/events", timeout=10)
    assert r.status_code == 401 and r.json()["error"] == "UNAUTHORIZED"


def test_grpc_subscribe_events_and_logs(stack, tmp_path):
    _, addr = stack.dispatcher()
    stack.worker(addr, queues="default,grpc-events")
    with grpc.insecure_channel(addr) as channel:
        api = api_pb2_grpc.ApiServiceStub(channel)
        stream = api.SubscribeEvents(api_pb2.SubscribeEventsRequest(queue_name="grpc-events"))
        seen: queue.Queue = queue.Queue()

        def read():
            try:
                for event in stream:
                    seen.put(event)
            except grpc.RpcError:
                pass

        threading.Thread(target=read, daemon=True).start()
        # The server answers with its headers once the subscription is registered.
        stream.initial_metadata()
        task = services.task_enqueue(task_name="sleep", queue="grpc-events", input={"seconds": 1.5})
        statuses = []
        while common_pb2.TASK_STATUS_COMPLETED not in statuses:
            event = seen.get(timeout=45)
            assert event.task_id == str(task.id) and event.queue_name == "grpc-events"
            statuses.append(event.new_status)
        assert statuses == [common_pb2.TASK_STATUS_PENDING, common_pb2.TASK_STATUS_DISPATCHING,
                            common_pb2.TASK_STATUS_RUNNING, common_pb2.TASK_STATUS_COMPLETED]
        stream.cancel()

        # Logs: history first, then live lines until the run ends.
        logged = services.task_enqueue(task_name="logs", queue="default", input={"lines": 2})
        wait_status(logged.id, "COMPLETED")
        run = TaskRun.objects.get(task_id=logged.id)
        wait_for(lambda: run.logs.count() == 4, what="log lines stored")
        history = list(api.SubscribeLogs(api_pb2.SubscribeLogsRequest(task_run_id=str(run.id),
                                                                      include_history=True), timeout=10))
        assert [e.message for e in history] == ["line 0", "line 1", "careful", "bad thing"]
        assert history[2].level == common_pb2.LOG_LEVEL_WARN and json.loads(history[0].metadata) == {"i": 0}
        assert list(api.SubscribeLogs(api_pb2.SubscribeLogsRequest(task_run_id=str(run.id)), timeout=10)) == []

        live = services.task_enqueue(task_name="sleep", queue="default", input={"seconds": 1.5})
        wait_status(live.id, "RUNNING")
        live_run = wait_for(lambda: TaskRun.objects.filter(task_id=live.id).first(), what="run")
        lines = list(api.SubscribeLogs(api_pb2.SubscribeLogsRequest(task_run_id=str(live_run.id),
                                                                    include_history=True), timeout=20))
        assert [e.message for e in lines] == ["sleeping"]
        try:
            list(api.SubscribeLogs(api_pb2.SubscribeLogsRequest(task_run_id="nope"), timeout=5))
            raise AssertionError("expected NOT_FOUND")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.NOT_FOUND


def test_a_dispatcher_serves_at_most_max_streams_subscriptions(stack):
    _, addr = stack.dispatcher(VALKA_MAX_STREAMS="2")
    with grpc.insecure_channel(addr) as channel:
        api = api_pb2_grpc.ApiServiceStub(channel)

        def subscribe():
            stream = api.SubscribeEvents(api_pb2.SubscribeEventsRequest())
            return stream, dict(stream.initial_metadata())  # headers once registered, or the refusal

        held = [subscribe(), subscribe()]
        assert all(metadata.get("x-valka-subscribed") == "events" for _, metadata in held)
        refused, metadata = subscribe()
        assert "x-valka-subscribed" not in metadata
        with pytest.raises(grpc.RpcError) as err:
            next(refused)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "VALKA_MAX_STREAMS" in err.value.details()

        held[0][0].cancel()  # counted out once it ends: another is served

        def admitted():
            stream, metadata = subscribe()
            if "x-valka-subscribed" in metadata:
                return stream
            stream.cancel()
            return None

        wait_for(admitted, what="a subscription served after one ended").cancel()
        held[1][0].cancel()


def test_sse_log_tail(stack):
    web = stack.web()
    _, addr = stack.dispatcher()
    stack.worker(addr)
    task = services.task_enqueue(task_name="sleep", queue="default", input={"seconds": 1.5})
    run = wait_for(lambda: TaskRun.objects.filter(task_id=task.id).first(), what="run")
    sink: queue.Queue = queue.Queue()
    stop = threading.Event()
    threading.Thread(target=_sse_reader, args=(f"{web}/api/v1/tasks/{task.id}/runs/{run.id}/logs/stream", sink,
                                               stop), daemon=True).start()
    got = _collect(sink, lambda got: any(e == "end" for e, _ in got))
    lines = [d for e, d in got if e == "log"]
    assert [line["message"] for line in lines] == ["sleeping"] and lines[0]["level"] == "INFO"
