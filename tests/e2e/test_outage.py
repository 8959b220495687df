"""A PostgreSQL outage longer than the worker timeout and the leases: nothing runs twice.

The stack runs on a cluster of its own, which the test stops and starts again while eight long
tasks run on two workers. The dispatcher keeps the workers' streams up and buffers what they
report; the scheduler, re-elected when the database is back, must judge no heartbeat, lease or
worker on the time the outage took.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from tests.helpers import Stack, query, wait_for
from valka import devdb
from valka_sdk.v1 import api_pb2, api_pb2_grpc


def _long_tasks(addr: str, count: int, seconds: float, marks: Path, **fields) -> list[str]:
    with grpc.insecure_channel(addr) as channel:
        api = api_pb2_grpc.ApiServiceStub(channel)
        return [api.CreateTask(api_pb2.CreateTaskRequest(
            queue_name="long", task_name="sleep", input=f'{{"seconds": {seconds}, "mark": "{marks}"}}', **fields),
            timeout=30).task.id for _ in range(count)]


def _outage(cluster: devdb.Cluster, stack: Stack, marks: Path, *, seconds: float, task_seconds: float,
            env: dict[str, str], heartbeat: float, timeout_seconds: int = 0) -> None:
    _, addr = stack.dispatcher(**env)
    stack.scheduler(**env)
    for name in ("a", "b"):
        stack.worker(addr, queues="long", concurrency=4, name=name, heartbeat=heartbeat)
    wait_for(lambda: query(cluster, "SELECT count(*) FROM workers WHERE status = 'CONNECTED'")[0][0] == 2,
             what="both workers connected")
    ids = _long_tasks(addr, 8, task_seconds, marks, timeout_seconds=timeout_seconds)
    wait_for(lambda: query(cluster, "SELECT count(*) FROM tasks WHERE status = 'RUNNING'")[0][0] == 8,
             what="the eight tasks running")

    cluster.stop("fast")
    time.sleep(seconds)
    cluster.start()

    wait_for(lambda: query(cluster, "SELECT count(*) FROM tasks WHERE status = 'COMPLETED'")[0][0] == 8,
             timeout=task_seconds + 60, what="the eight tasks completed")
    runs = query(cluster, "SELECT task_id::text, status FROM task_runs")
    assert sorted(runs) == sorted((task_id, "COMPLETED") for task_id in ids)  # one run each, none LOST
    started = Counter(path.name.split(".")[0] for path in marks.glob("*.started.*"))
    finished = Counter(path.name.split(".")[0] for path in marks.glob("*.finished.*"))
    assert started == finished == Counter(ids)  # each handler ran once, to its end
    assert wait_for(lambda: query(cluster, "SELECT name, status FROM workers ORDER BY name") == [
        ("a", "CONNECTED"), ("b", "CONNECTED")], timeout=15, what="both workers connected")


@pytest.mark.long
@pytest.mark.timeout(300)
def test_a_40_second_outage_with_a_10_second_worker_timeout_runs_nothing_twice(own_cluster, own_stack, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    _outage(own_cluster, own_stack, marks, seconds=40, task_seconds=60, heartbeat=3, timeout_seconds=10,
            env={"VALKA_WORKER_TIMEOUT": "10", "VALKA_LEASE_EXTENSION": "15", "VALKA_REAPER_INTERVAL": "1"})


@pytest.mark.long
@pytest.mark.timeout(400)
def test_a_2_minute_outage_with_the_default_settings_runs_nothing_twice(own_cluster, own_stack, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    _outage(own_cluster, own_stack, marks, seconds=120, task_seconds=150, heartbeat=30, env={})
