"""End to end over real gRPC: a dispatcher process, SDK worker processes, the test database."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta

import pytest

from tasks import services
from tasks.models import DeadLetter, QueueOffer, Task, TaskLog, TaskRun
from tests.helpers import Feeder, has_scheduler, wait_for, wait_status
from valka_sdk.errors import parse_failure

FINAL = {"COMPLETED", "FAILED", "DEAD_LETTER", "CANCELLED"}


def test_happy_path(stack):
    _, addr = stack.dispatcher()
    stack.worker(addr)
    task = services.task_enqueue(task_name="echo", queue="default", input={"hello": "world"})
    done = wait_status(task.id, "COMPLETED")
    assert done.output["echo"] == {"hello": "world"}
    assert done.output["attempt"] == 1 and done.attempt_count == 1
    assert done.started_at and done.finished_at and done.error_message is None
    run = TaskRun.objects.get(task_id=task.id)
    assert run.status == "COMPLETED" and run.attempt_number == 1 and run.finished_at
    assert run.output == done.output


def test_an_idle_dispatcher_is_handed_a_new_task_in_its_insert(stack):
    """An idle dispatcher offers its worker's free slots (dispatcher/offers.py): a task inserted on
    its own then goes to it DISPATCHING in its INSERT, is sent without a claim, and runs; a large
    one too, read from its row. Once the dispatcher stops, its offers are gone."""
    proc, addr = stack.dispatcher()
    stack.worker(addr, concurrency=4)
    wait_for(lambda: QueueOffer.objects.filter(queue="default", slots=4).exists(), what="an offer of 4 slots")
    task = services.task_enqueue(task_name="echo", queue="default", input={"hello": "handed"})
    large = services.task_enqueue(task_name="echo", queue="default", input={"blob": "x" * 20_000})
    assert task.status == large.status == "DISPATCHING"
    assert wait_status(task.id, "COMPLETED").output["echo"] == {"hello": "handed"}
    assert wait_status(large.id, "COMPLETED").output["echo"] == {"blob": "x" * 20_000}
    assert TaskRun.objects.get(task_id=task.id).attempt_number == 1
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    assert not QueueOffer.objects.filter(slots__gt=0).exists()
    after = services.task_enqueue(task_name="echo", queue="default")
    assert after.status == "PENDING"


def test_sync_handler_and_logs(stack):
    _, addr = stack.dispatcher()
    stack.worker(addr)
    a = services.task_enqueue(task_name="sync_echo", queue="default", input=[1, 2])
    b = services.task_enqueue(task_name="logs", queue="default", input={"lines": 2})
    assert wait_status(a.id, "COMPLETED").output == {"echo": [1, 2]}
    wait_status(b.id, "COMPLETED")
    lines = wait_for(lambda: list(TaskLog.objects.filter(task_id=b.id).order_by("id")) if
                     TaskLog.objects.filter(task_id=b.id).count() == 4 else None, what="4 log lines")
    assert [(line.level, line.message) for line in lines] == [
        ("INFO", "line 0"), ("INFO", "line 1"), ("WARN", "careful"), ("ERROR", "bad thing")]
    assert lines[1].metadata == {"i": 1}
    assert lines[0].run_id == TaskRun.objects.get(task_id=b.id).id


def test_non_retryable_and_unknown_task_fail_for_good(stack):
    _, addr = stack.dispatcher()
    stack.worker(addr)
    fatal = services.task_enqueue(task_name="fatal", queue="default")
    unknown = services.task_enqueue(task_name="no_such_handler", queue="default")
    fatal_error = parse_failure(wait_status(fatal.id, "FAILED").error_message)
    assert fatal_error.summary == "not worth retrying"
    assert fatal_error.exception_class_path == "valka_sdk.errors.NonRetryableError"
    assert 'worker_app.py", line' in fatal_error.traceback and "in fatal" in fatal_error.traceback
    failed = wait_status(unknown.id, "FAILED")
    assert failed.error_message.startswith("no handler registered for task 'no_such_handler'")
    assert parse_failure(failed.error_message).traceback is None, "the worker's own refusal needs no traceback"
    assert failed.attempt_count == 1 and TaskRun.objects.get(task_id=unknown.id).status == "FAILED"


def test_retryable_failure_waits_with_backoff_then_dead_letters(stack):
    _, addr = stack.dispatcher(VALKA_RETRY_BASE_DELAY="30")
    stack.worker(addr)
    retrying = services.task_enqueue(task_name="always_fail", queue="default", max_retries=2)
    no_retries = services.task_enqueue(task_name="always_fail", queue="default", max_retries=0)
    t = wait_status(retrying.id, "RETRY")
    # First backoff: 30 s ± 25%.
    delay = (t.run_at - t.updated_at).total_seconds()
    assert 22 <= delay <= 38, delay
    assert parse_failure(t.error_message).summary == "RuntimeError: always fails"
    assert parse_failure(t.error_message).exception_class_path == "builtins.RuntimeError"
    dead = wait_status(no_retries.id, "DEAD_LETTER")
    assert dead.attempt_count == 1 and dead.finished_at
    assert parse_failure(dead.error_message).summary == "RuntimeError: always fails"
    letter = DeadLetter.objects.get(task_id=no_retries.id)
    assert letter.error_message == dead.error_message and letter.attempt_count == 1


def test_priority_order_and_run_at(stack, tmp_path):
    now = datetime.now(UTC)
    low = services.task_enqueue(task_name="echo", queue="prio", priority=1)
    high = services.task_enqueue(task_name="echo", queue="prio", priority=10)
    mid = services.task_enqueue(task_name="echo", queue="prio", priority=5)
    later = services.task_enqueue(task_name="echo", queue="prio", priority=100, run_at=now + timedelta(seconds=3))
    _, addr = stack.dispatcher()
    stack.worker(addr, queues="prio", concurrency=1)
    for t in (low, high, mid):
        wait_status(t.id, "COMPLETED")
    # Run ids are time-ordered ids made by the dispatcher as it hands tasks out.
    order = {t.id: TaskRun.objects.get(task_id=t.id).id for t in (low, high, mid)}
    assert order[high.id] < order[mid.id] < order[low.id]
    wait_status(later.id, "COMPLETED", timeout=45)
    assert TaskRun.objects.get(task_id=later.id).started_at >= later.run_at


def test_cancelling_a_running_task_reaches_the_handler(stack, tmp_path):
    _, addr = stack.dispatcher()
    stack.worker(addr)
    task = services.task_enqueue(task_name="sleep", queue="default", input={"seconds": 30, "mark": str(tmp_path)})
    wait_status(task.id, "RUNNING")
    wait_for(lambda: list(tmp_path.glob(f"{task.id}.started.*")), what="handler started")
    services.task_cancel(task_id=task.id)
    wait_for(lambda: list(tmp_path.glob(f"{task.id}.cancelled.*")), what="handler saw the cancellation")
    t = Task.objects.get(id=task.id)
    assert t.status == "CANCELLED"
    assert TaskRun.objects.get(task_id=task.id).status == "CANCELLED"
    # The worker's slot is free again: a new task runs.
    nxt = services.task_enqueue(task_name="echo", queue="default")
    wait_status(nxt.id, "COMPLETED")


def test_sync_handler_sees_cancellation(stack, tmp_path):
    _, addr = stack.dispatcher()
    stack.worker(addr)
    task = services.task_enqueue(task_name="sync_sleep", queue="default",
                                 input={"seconds": 30, "mark": str(tmp_path)})
    wait_status(task.id, "RUNNING")
    services.task_cancel(task_id=task.id)
    wait_for(lambda: list(tmp_path.glob(f"{task.id}.cancelled.*")), what="sync handler saw the flag")


def test_killed_worker_tasks_are_released_at_once(stack, tmp_path):
    """SIGKILL a worker mid-task: the dispatcher sees the stream drop and retries the task
    (no waiting for the lease); with the scheduler running, another worker completes it."""
    _, addr = stack.dispatcher(VALKA_RETRY_BASE_DELAY="0.2")
    victim = stack.worker(addr, name="victim", concurrency=1)
    # Long enough that the kill lands mid-task however slowly this test gets to send it.
    task = services.task_enqueue(task_name="sleep", queue="default", input={"seconds": 5, "mark": str(tmp_path)})
    wait_for(lambda: list(tmp_path.glob(f"{task.id}.started.1.{victim.pid}")), what="the victim runs it")
    victim.send_signal(signal.SIGKILL)
    # The handler may start before the dispatcher has written the run: wait for the row, then for it to be lost.
    wait_for(lambda: TaskRun.objects.filter(task_id=task.id, attempt_number=1).exists(), what="run 1 written")
    first = TaskRun.objects.get(task_id=task.id, attempt_number=1)
    wait_for(lambda: TaskRun.objects.get(id=first.id).status == "LOST", what="run 1 lost")
    assert TaskRun.objects.get(id=first.id).error_message == "worker disconnected"
    if not has_scheduler():
        pytest.skip("the retry engine (scheduler) is not available yet")
    stack.scheduler(VALKA_SCHEDULER_MAX_SLEEP="0.2")
    stack.worker(addr, name="rescuer", concurrency=1)
    t = wait_status(task.id, "COMPLETED", timeout=45)
    assert t.attempt_count == 2 and t.output["attempt"] == 2
    assert not Task.objects.filter(status__in=["RUNNING", "DISPATCHING"]).exists()


def test_reconnect_with_the_same_worker_id_replaces_the_session(stack):
    import grpc

    from valka_sdk.v1 import worker_pb2 as pb
    from valka_sdk.v1 import worker_pb2_grpc

    _, addr = stack.dispatcher()
    task = services.task_enqueue(task_name="anything", queue="reconnect")
    hello = pb.WorkerRequest(hello=pb.WorkerHello(worker_id="same-id", worker_name="x", queues=["reconnect"],
                                                  concurrency=1))
    with grpc.insecure_channel(addr) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        requests_a = Feeder([hello])
        call_a = stub.Session(iter(requests_a))
        assignment = next(call_a).task_assignment
        assert assignment.task_id == str(task.id) and assignment.attempt_number == 1
        wait_status(task.id, "RUNNING")
        # Same worker id on a new stream (the old one looks alive to the server): the old run is lost.
        requests_b = Feeder([hello])
        call_b = stub.Session(iter(requests_b))
        t = wait_status(task.id, "RETRY")
        assert TaskRun.objects.get(task_id=task.id).status == "LOST"
        assert t.attempt_count == 1
        requests_a.close()
        requests_b.close()
        call_a.cancel()
        call_b.cancel()


def test_retry_then_success_with_the_scheduler(stack, tmp_path):
    if not has_scheduler():
        pytest.skip("the retry engine (scheduler) is not available yet")
    _, addr = stack.dispatcher(VALKA_RETRY_BASE_DELAY="0.2")
    stack.scheduler(VALKA_SCHEDULER_MAX_SLEEP="0.2")
    stack.worker(addr)
    task = services.task_enqueue(task_name="fail_until", queue="default", input={"succeed_on": 3})
    done = wait_status(task.id, "COMPLETED")
    assert done.output == {"succeeded_on": 3} and done.attempt_count == 3
    runs = list(TaskRun.objects.filter(task_id=task.id).order_by("attempt_number"))
    assert [(r.attempt_number, r.status) for r in runs] == [(1, "FAILED"), (2, "FAILED"), (3, "COMPLETED")]
    assert parse_failure(runs[0].error_message).summary == "RuntimeError: failing attempt 1"
    # The second attempt waited for its backoff (0.2 s ± 25%) after the first one failed.
    assert (runs[1].started_at - runs[0].finished_at).total_seconds() >= 0.15
