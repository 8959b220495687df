"""End to end: a worker SIGKILLed mid-task while its dispatcher dies too, so nobody
reports the loss. The lease runs out, the scheduler's reaper closes the run as lost
and the task retries; a new dispatcher and worker pick it up as attempt 2."""

import os
import signal

import pytest

from tasks import services
from tasks.models import Task, TaskRun
from tests.helpers import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_reaper_recovers_a_task_whose_worker_and_dispatcher_died(stack, tmp_path):
    dispatcher, addr = stack.dispatcher()
    victim = stack.worker(addr, name="victim", concurrency=1)
    task = services.task_enqueue(task_name="sleep", queue="default", timeout_seconds=3, max_retries=2,
                                 input={"seconds": 60, "mark": str(tmp_path)})
    wait_for(lambda: list(tmp_path.glob(f"{task.id}.started.1.*")), what="attempt 1 running")
    # The handler starts as soon as the assignment arrives; the dispatcher records the start a moment later.
    wait_for(lambda: Task.objects.get(id=task.id).status == "RUNNING", what="attempt 1 recorded as RUNNING")
    # The dispatcher goes first, so nothing is left to notice the worker's stream drop.
    os.killpg(dispatcher.pid, signal.SIGKILL)
    dispatcher.wait(10)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    assert Task.objects.get(id=task.id).status == "RUNNING"
    run = TaskRun.objects.get(task_id=task.id, attempt_number=1)
    assert run.status == "RUNNING"

    # A short lease extension: the reaper's grace after PostgreSQL started (the test's cluster, a
    # moment ago) is one extension (see tasks.sql.maintenance.EXPIRED_LEASES).
    stack.scheduler(VALKA_REAPER_INTERVAL="0.5", VALKA_RETRY_BASE_DELAY="0.2", VALKA_SCHEDULER_MAX_SLEEP="0.2",
                    VALKA_LEASE_EXTENSION="2")
    wait_for(lambda: TaskRun.objects.get(id=run.id).status == "LOST", what="the expired run reaped")
    assert TaskRun.objects.get(id=run.id).error_message == "lease expired"
    wait_for(lambda: Task.objects.get(id=task.id).status == "PENDING", what="the retry due")

    _, addr = stack.dispatcher()
    stack.worker(addr, name="rescuer", concurrency=1, heartbeat=0.5)
    wait_for(lambda: list(tmp_path.glob(f"{task.id}.started.2.*")), what="attempt 2 running elsewhere")
    # The dispatcher records the start in its next flush, just after the worker has begun.
    wait_for(lambda: Task.objects.get(id=task.id).attempt_count == 2, what="attempt 2 recorded")
    assert Task.objects.get(id=task.id).status == "RUNNING"
