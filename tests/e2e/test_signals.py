"""Signals end to end: REST → NOTIFY → the dispatcher holding the task → the handler → ack."""

from __future__ import annotations

import signal as os_signal

import pytest
from rest_framework.test import APIClient

from signals import services
from signals.models import Signal
from tasks import services as task_services
from tasks.models import TaskRun
from tests.helpers import has_scheduler, wait_for, wait_status


@pytest.fixture
def api(settings):
    # A generous delivery wait: these tests assert `delivered`, on a machine that may be busy.
    settings.VALKA = {**settings.VALKA, "API_ANONYMOUS": True, "SIGNAL_DELIVERY_WAIT": 5.0}
    return APIClient()


def sig(signal_id) -> Signal:
    return Signal.objects.get(id=signal_id)


def test_delivery_and_acknowledgement_with_timestamps(stack, tmp_path, api):
    _, addr = stack.dispatcher()
    stack.worker(addr)
    gate = tmp_path / "consume"
    task = task_services.task_enqueue(task_name="collect_signals", queue="default",
                                      input={"count": 1, "gate": str(gate), "mark": str(tmp_path)})
    wait_for(lambda: list(tmp_path.glob(f"{task.id}.started.*")), what="handler started")
    r = api.post(f"/api/v1/tasks/{task.id}/signal", {"signal_type": "progress_request", "payload": {"x": 1}},
                 format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["signal_type"] == "progress_request" and body["delivered"] is True
    assert body["status"] == "DELIVERED"
    s = sig(body["id"])
    assert s.status == "DELIVERED" and s.delivered_at and s.acknowledged_at is None
    assert s.delivered_at >= s.created_at
    gate.touch()
    done = wait_status(task.id, "COMPLETED")
    assert done.output["signals"] == [{"id": body["id"], "type": "progress_request", "payload": {"x": 1}}]
    s = wait_for(lambda: sig(body["id"]) if sig(body["id"]).status == "ACKNOWLEDGED" else None, what="ack")
    assert s.acknowledged_at >= s.delivered_at
    listed = api.get(f"/api/v1/tasks/{task.id}/signals", {"status": "ACKNOWLEDGED"}).json()
    assert listed["count"] == 1 and listed["results"][0]["id"] == body["id"]
    assert api.get(f"/api/v1/signals/{body['id']}").json()["status"] == "ACKNOWLEDGED"


def test_signals_sent_while_pending_arrive_in_order_after_assignment(stack, api):
    task = task_services.task_enqueue(task_name="collect_signals", queue="default", input={"count": 3})
    ids = []
    for n in range(3):
        r = api.post(f"/api/v1/tasks/{task.id}/signal", {"signal_name": f"s{n}", "payload": n}, format="json")
        assert r.status_code == 201 and r.json()["delivered"] is False and r.json()["status"] == "PENDING"
        ids.append(r.json()["id"])
    _, addr = stack.dispatcher()
    stack.worker(addr)
    done = wait_status(task.id, "COMPLETED")
    assert [s["id"] for s in done.output["signals"]] == ids
    assert [s["type"] for s in done.output["signals"]] == ["s0", "s1", "s2"]
    wait_for(lambda: Signal.objects.filter(task_id=task.id, status="ACKNOWLEDGED").count() == 3, what="3 acks")


def test_two_dispatchers_the_holder_delivers(stack, tmp_path):
    _, addr_a = stack.dispatcher()
    _, addr_b = stack.dispatcher()
    stack.worker(addr_a, queues="only-a", name="a")
    stack.worker(addr_b, queues="only-b", name="b")
    tasks = [task_services.task_enqueue(task_name="collect_signals", queue=q, input={"count": 1,
                                                                                     "mark": str(tmp_path)})
             for q in ("only-a", "only-b")]
    for t in tasks:
        wait_for(lambda t=t: list(tmp_path.glob(f"{t.id}.started.*")), what="started")
    for t in tasks:
        s, delivered = services.signal_send(task_id=t.id, signal_type="ping", payload={"to": t.queue}, wait=5.0)
        assert delivered
    for t, worker_name in zip(tasks, ("a", "b"), strict=True):
        done = wait_status(t.id, "COMPLETED")
        assert done.output["worker"] == worker_name and done.output["signals"][0]["payload"] == {"to": t.queue}


def test_worker_killed_before_ack_gets_the_signal_again_on_the_retry(stack, tmp_path):
    if not has_scheduler():
        pytest.skip("the retry engine (scheduler) is not available yet")
    _, addr = stack.dispatcher(VALKA_RETRY_BASE_DELAY="0.2")
    stack.scheduler(VALKA_SCHEDULER_MAX_SLEEP="0.2")
    victim = stack.worker(addr, name="victim", concurrency=1)
    task = task_services.task_enqueue(task_name="collect_signals", queue="default",
                                      input={"count": 1, "gate": str(tmp_path / "never"), "mark": str(tmp_path)})
    wait_for(lambda: list(tmp_path.glob(f"{task.id}.started.1.{victim.pid}")), what="victim runs it")
    wait_status(task.id, "RUNNING")  # the dispatcher records the start just after the handler begins
    s, delivered = services.signal_send(task_id=task.id, signal_type="shutdown", wait=5.0)
    assert delivered and sig(s.id).status == "DELIVERED"
    victim.send_signal(os_signal.SIGKILL)
    stack.worker(addr, name="rescuer", concurrency=1)
    done = wait_status(task.id, "COMPLETED", timeout=30)
    assert done.output["attempt"] == 2 and done.output["worker"] == "rescuer"
    assert done.output["signals"][0]["id"] == str(s.id)
    wait_for(lambda: sig(s.id).status == "ACKNOWLEDGED", what="ack on the second attempt")
    assert TaskRun.objects.get(task_id=task.id, attempt_number=1).status == "LOST"


def test_grpc_send_signal(stack, tmp_path):
    import grpc

    from valka_sdk.v1 import api_pb2, api_pb2_grpc

    _, addr = stack.dispatcher(VALKA_SIGNAL_DELIVERY_WAIT="5")
    stack.worker(addr)
    task = task_services.task_enqueue(task_name="collect_signals", queue="default",
                                      input={"count": 1, "mark": str(tmp_path)})
    wait_for(lambda: list(tmp_path.glob(f"{task.id}.started.*")), what="handler started")
    with grpc.insecure_channel(addr) as channel:
        api = api_pb2_grpc.ApiServiceStub(channel)
        answer = api.SendSignal(api_pb2.SendSignalRequest(task_id=str(task.id), signal_name="progress_request",
                                                          payload='{"k": 1}'))
        assert answer.delivered and sig(answer.signal_id).signal_type == "progress_request"
        done = wait_status(task.id, "COMPLETED")
        assert done.output["signals"][0] == {"id": answer.signal_id, "type": "progress_request",
                                             "payload": {"k": 1}}
        for request, code in [
            (api_pb2.SendSignalRequest(task_id=str(task.id), signal_name="late"), grpc.StatusCode.FAILED_PRECONDITION),
            (api_pb2.SendSignalRequest(task_id=str(task.id)), grpc.StatusCode.INVALID_ARGUMENT),
            (api_pb2.SendSignalRequest(task_id="nope", signal_name="x"), grpc.StatusCode.NOT_FOUND),
        ]:
            with pytest.raises(grpc.RpcError) as err:
                api.SendSignal(request)
            assert err.value.code() == code
