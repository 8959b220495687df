"""The gRPC floor: what the valka.v1 worker stream alone carries on this machine, with no
database and no task handling, between two Python processes (grpcio's asyncio API, as the
dispatcher and the SDK worker use it).

The server process hands out bare TaskAssignments, keeping `concurrency` in flight like the
dispatcher does for a worker of that concurrency; the client answers each with a successful
TaskResult at once. A drain of Valka cannot go faster than this with one worker process:
each task is one message each way on this stream.

    python -m bench.grpc_floor serve PORT      # the server side, run by `drain()` below
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc

from bench.measure import rounds_summary
from bench.stack import ROOT, wait_for
from valka.devdb import free_port, listening
from valka_sdk.v1 import worker_pb2 as pb
from valka_sdk.v1 import worker_pb2_grpc

TASK_ID = "0197c5a2-5b1e-7000-8000-000000000001"
RUN_ID = "0197c5a2-5b1e-7000-8000-000000000002"


class FloorService(worker_pb2_grpc.WorkerServiceServicer):
    """Sends `n` assignments (taken from the hello's metadata), `concurrency` at a time."""

    async def Session(self, request_iterator, context):  # noqa: N802 (gRPC name)
        hello = (await context.read()).hello
        n, concurrency = int(hello.metadata), max(1, hello.concurrency)
        assignment = pb.WorkerResponse(task_assignment=pb.TaskAssignment(
            task_id=TASK_ID, task_run_id=RUN_ID, queue_name="drain", task_name="noop", metadata="{}",
            attempt_number=1, timeout_seconds=300))
        answered = asyncio.Queue()

        async def read() -> None:
            while (await context.read()) is not grpc.aio.EOF:
                answered.put_nowait(True)
            answered.put_nowait(False)

        reader = asyncio.create_task(read())
        sent = 0
        while sent < min(n, concurrency):
            await context.write(assignment)
            sent += 1
        while await answered.get():
            if sent < n:
                await context.write(assignment)
                sent += 1
        reader.cancel()


async def _serve(port: int) -> None:
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(FloorService(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def _client(addr: str, n: int, concurrency: int) -> float:
    async with grpc.aio.insecure_channel(addr) as channel:
        call = worker_pb2_grpc.WorkerServiceStub(channel).Session()
        await call.write(pb.WorkerRequest(hello=pb.WorkerHello(
            worker_id="floor", queues=["drain"], concurrency=concurrency, metadata=str(n))))
        start = time.perf_counter()
        for _ in range(n):
            got = (await call.read()).task_assignment
            await call.write(pb.WorkerRequest(task_result=pb.TaskResult(
                task_id=got.task_id, task_run_id=got.task_run_id, success=True)))
        seconds = time.perf_counter() - start
        await call.done_writing()
        return seconds


@contextmanager
def server() -> Iterator[tuple[str, int]]:
    """The floor's server in a process of its own, for the block; yields its address and pid."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.grpc_floor", "serve", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: listening(port), 30, "the gRPC floor server")
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def round_rate(addr: str, *, n: int, concurrency: int) -> float:
    """One round against `server()`'s `addr`: n round trips ÷ seconds."""
    return n / asyncio.run(_client(addr, n, concurrency))


def drain(*, n: int, rounds: int, concurrency: int) -> dict[str, Any]:
    """Median over `rounds` of n round trips ÷ seconds, server and client in separate processes."""
    with server() as (addr, _):
        rates = [round_rate(addr, n=n, concurrency=concurrency) for _ in range(rounds)]
    return rounds_summary(rates, n=n, concurrency=concurrency)


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m bench.grpc_floor serve PORT")
    asyncio.run(_serve(int(sys.argv[2])))
