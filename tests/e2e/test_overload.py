"""Overload: workers report far more than the database can take (here: nothing, it is down for a
minute). The dispatcher's memory stays bounded: its writer's buffer is, and once full it stops
reading from workers, whose sends gRPC's flow control holds back. Nothing is dropped: everything
reaches the database once it is back."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from tests.helpers import MiB, query, wait_for
from valka_sdk.v1 import api_pb2, api_pb2_grpc

BOUND_MIB = 250  # the dispatcher's resident memory, all through: about 95 MiB at rest, 190 at most here
LINES, LINE_BYTES, RUNS = 9_000, 1_000, 32  # about 300 MB of log lines, under each run's 10 MiB


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.long
@pytest.mark.timeout(400)
def test_a_minute_without_the_database_under_a_flood_of_logs_keeps_the_dispatcher_bounded(
        own_cluster, own_stack, tmp_path):
    dispatcher, addr = own_stack.dispatcher()
    for i in range(8):
        own_stack.worker(addr, queues="flood", concurrency=4, name=f"w{i}")
    wait_for(lambda: query(own_cluster, "SELECT count(*) FROM workers WHERE status = 'CONNECTED'")[0][0] == 8,
             what="eight workers")
    gate = tmp_path / "gate"
    with grpc.insecure_channel(addr) as channel:
        api = api_pb2_grpc.ApiServiceStub(channel)
        for _ in range(RUNS):
            api.CreateTask(api_pb2.CreateTaskRequest(
                queue_name="flood", task_name="many_logs", timeout_seconds=900,
                input=f'{{"lines": {LINES}, "bytes": {LINE_BYTES}, "gate": "{gate}"}}'), timeout=30)
    wait_for(lambda: query(own_cluster, "SELECT count(*) FROM tasks WHERE status = 'RUNNING'")[0][0] == RUNS,
             what="every task running")

    own_cluster.stop("fast")
    gate.touch()  # the handlers log as fast as they can, the database away
    peak, deadline = 0.0, time.monotonic() + 60
    while time.monotonic() < deadline:
        peak = max(peak, _rss_mib(dispatcher.pid))
        time.sleep(0.2)
    own_cluster.start()

    wait_for(lambda: query(own_cluster, "SELECT count(*) FROM tasks WHERE status = 'COMPLETED'")[0][0] == RUNS,
             timeout=240, interval=0.5, what="every task completed")
    assert peak < BOUND_MIB, f"the dispatcher reached {peak:.0f} MiB"
    counts = query(own_cluster, "SELECT r.id, count(l.id), sum(length(l.message)) FROM task_runs r "
                                "LEFT JOIN task_logs l ON l.run_id = r.id GROUP BY r.id")
    assert len(counts) == RUNS
    assert {(lines, size) for _, lines, size in counts} == {(LINES, LINES * (LINE_BYTES + 7))}  # every line
    assert LINES * (LINE_BYTES + 7) < 10 * MiB
