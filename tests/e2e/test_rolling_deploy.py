"""A rolling deploy: a dispatcher gets SIGTERM and a new one starts on its address while its
workers are busy. No run is lost and nothing runs twice: tasks that end during the drain report
to the old dispatcher, longer ones are handed over to the new one, and the old one is gone
before the orchestrator's grace period ends."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

from tasks import services
from tasks.models import Task, TaskRun
from tests.helpers import Stack, wait_for
from valka.devdb import free_port


def _restart(stack: Stack, proc: subprocess.Popen, port: int, grace: float, **env: str) -> float:
    """SIGTERM, then SIGKILL after `grace` seconds as Kubernetes does; a new dispatcher on the same
    port. Returns how long the old one took to go."""
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    took = time.monotonic() - began
    stack.dispatcher(port, **env)
    return took


def _executions(marks: Path, what: str) -> Counter:
    return Counter(path.name.split(".")[0] for path in marks.glob(f"*.{what}.*"))


def test_a_dispatcher_restarted_under_200_short_tasks_loses_no_run_and_runs_none_twice(stack, tmp_path):
    port = free_port()
    proc, addr = stack.dispatcher(port)
    for i in range(4):
        stack.worker(addr, concurrency=4, name=f"w{i}", heartbeat=2)
    marks = tmp_path / "marks"
    marks.mkdir()
    tasks = services.task_enqueue_many(
        [{"task_name": "sleep", "queue": "default", "input": {"seconds": 1, "mark": str(marks)}}] * 200)
    wait_for(lambda: Task.objects.filter(status="COMPLETED").count() >= 40, what="the first tasks done")
    took = _restart(stack, proc, port, grace=30)
    assert took < 25, f"the old dispatcher took {took:.1f} s to go"
    wait_for(lambda: Task.objects.filter(status="COMPLETED").count() == 200, timeout=120, what="all done")
    assert not TaskRun.objects.filter(status="LOST").exists()
    assert TaskRun.objects.count() == 200  # one run each
    assert _executions(marks, "started") == Counter(str(t.id) for t in tasks)  # each ran once


def test_tasks_longer_than_the_shutdown_are_handed_over_to_the_next_dispatcher(stack, tmp_path):
    port = free_port()
    env = {"VALKA_SHUTDOWN_TIMEOUT": "8"}
    proc, addr = stack.dispatcher(port, **env)
    for i in range(2):
        stack.worker(addr, concurrency=2, name=f"w{i}", heartbeat=2)
    marks = tmp_path / "marks"
    marks.mkdir()
    tasks = services.task_enqueue_many(
        [{"task_name": "sleep", "queue": "default", "input": {"seconds": 15, "mark": str(marks)}}] * 4)
    wait_for(lambda: Task.objects.filter(status="RUNNING").count() == 4, what="the four running")
    took = _restart(stack, proc, port, grace=10, **env)  # a grace period shorter than the tasks
    assert took < 8.5, f"the old dispatcher took {took:.1f} s to go"
    wait_for(lambda: Task.objects.filter(status="COMPLETED").count() == 4, timeout=60, what="all done")
    assert not TaskRun.objects.filter(status="LOST").exists()
    assert TaskRun.objects.count() == 4
    assert _executions(marks, "started") == _executions(marks, "finished") == Counter(str(t.id) for t in tasks)


def test_tasks_that_end_while_no_dispatcher_is_up_report_to_the_next_one(stack, tmp_path):
    """The worker keeps trying to reconnect while nothing listens; results made between its
    attempts are held for the stream that finally opens."""
    port = free_port()
    env = {"VALKA_SHUTDOWN_TIMEOUT": "5"}  # no drain: the streams end at once
    proc, addr = stack.dispatcher(port, **env)
    stack.worker(addr, concurrency=2, name="w0", heartbeat=1, VALKA_TEST_RECONNECT_MAX="0.5")
    marks = tmp_path / "marks"
    marks.mkdir()
    tasks = services.task_enqueue_many(
        [{"task_name": "sleep", "queue": "default", "input": {"seconds": 4, "mark": str(marks)}}] * 2)
    wait_for(lambda: Task.objects.filter(status="RUNNING").count() == 2, what="the two running")
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    wait_for(lambda: sum(_executions(marks, "finished").values()) == 2, timeout=30, what="the runs' ends")
    time.sleep(2)  # the worker keeps trying meanwhile
    stack.dispatcher(port, **env)
    wait_for(lambda: Task.objects.filter(status="COMPLETED").count() == 2, timeout=30, what="all done")
    assert not TaskRun.objects.filter(status="LOST").exists()
    assert TaskRun.objects.count() == 2
    assert _executions(marks, "started") == _executions(marks, "finished") == Counter(str(t.id) for t in tasks)
