"""The delivery floor: how soon a committed row's NOTIFY can reach a worker process over the
valka.v1 worker stream on this machine, with none of Valka's work in between.

An idle-worker task travels: the enqueue's INSERT + NOTIFY + commit, the NOTIFY to the
dispatcher's LISTEN connection, an assignment written on the worker's stream, the worker process
reading it. Here a relay process (the dispatcher's stand-in: a psycopg LISTEN connection and a
grpcio asyncio server) writes each notification's payload as a bare TaskAssignment on the stream
of a receiving process (the worker's stand-in: a grpcio asyncio client), which notes the moment
each one arrives. No claim, no task row read, no handler: what is left is PostgreSQL's delivery,
the gRPC hop and the two processes' wake-ups, on the same two cores as everything else.

The latency workload takes `Delivery.send` in turns with its enqueues (bench/drain.py `latency`),
so both are measured at the same pace and in the same moments; the figures of Valka's and its
peers' latency from the enqueue's return are compared with this one's.

    python -m bench.latency_floor relay PORT CONNINFO    # run by `delivery()` below
    python -m bench.latency_floor receive ADDRESS        # prints "ready", then the arrivals as JSON
"""

from __future__ import annotations

import asyncio
import json
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import psycopg

from bench.measure import arrival_summary
from bench.stack import ROOT, wait_for
from valka.devdb import free_port, listening
from valka_sdk.v1 import worker_pb2 as pb
from valka_sdk.v1 import worker_pb2_grpc

CHANNEL = "floor_delivery"
READY, END = "ready", "end"
# One row and its NOTIFY in one statement and commit, as an enqueue of a task due now (the
# table is bench/floor.py's SCHEMA); the row's id is the payload.
SEND = (f"WITH i AS (INSERT INTO floor_jobs (queue, status, payload) VALUES ('delivery', 'pending', '{{}}') "
        f"RETURNING id) SELECT id, pg_notify('{CHANNEL}', id::text) FROM i")


def _assignment(task_id: str) -> pb.WorkerResponse:
    return pb.WorkerResponse(task_assignment=pb.TaskAssignment(
        task_id=task_id, task_run_id=task_id, queue_name="delivery", task_name="noop", metadata="{}",
        attempt_number=1, timeout_seconds=300))


class Relay(worker_pb2_grpc.WorkerServiceServicer):
    """Each notification on CHANNEL, written to the session's stream as it is read; READY first,
    once the LISTEN is in place, so that nothing sent afterwards is missed."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo

    async def Session(self, request_iterator, context):  # noqa: N802 (gRPC name)
        await context.read()  # the hello
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            await conn.execute(f"LISTEN {CHANNEL}")
            await context.write(_assignment(READY))
            async for note in conn.notifies():
                await context.write(_assignment(note.payload))
                if note.payload == END:
                    return


async def _relay(port: int, conninfo: str) -> None:
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(Relay(conninfo), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def _receive(address: str) -> dict[str, float]:
    """Each assignment's arrival (time.time()) by its task id, until END."""
    arrived: dict[str, float] = {}
    async with grpc.aio.insecure_channel(address) as channel:
        call = worker_pb2_grpc.WorkerServiceStub(channel).Session()
        await call.write(pb.WorkerRequest(hello=pb.WorkerHello(worker_id="floor", queues=["delivery"],
                                                               concurrency=1)))
        while True:
            response = await call.read()
            now = time.time()
            if response is grpc.aio.EOF:
                break
            task_id = response.task_assignment.task_id
            if task_id == END:
                break
            if task_id == READY:
                print(READY, flush=True)
            else:
                arrived[task_id] = now
        call.cancel()
    return arrived


class Delivery:
    """`send` one row and its NOTIFY (noting the call's start and return); `figures` afterwards."""

    def __init__(self, conn: psycopg.Connection, receiver: subprocess.Popen) -> None:
        self.conn = conn
        self.receiver = receiver
        self.sent: dict[str, tuple[float, float]] = {}

    def send(self) -> None:
        before = time.time()
        row = self.conn.execute(SEND, prepare=True).fetchone()
        self.sent[str(row[0])] = (before, time.time())  # type: ignore[index]

    def figures(self) -> dict[str, Any]:
        """p50/p99 of arrival − return (and of arrival − call, under "from_call"), in ms: every
        row sent must have arrived."""
        self.conn.execute(f"SELECT pg_notify('{CHANNEL}', '{END}')")
        out, _ = self.receiver.communicate(timeout=60)
        arrived = json.loads(out.splitlines()[-1])
        missing = set(self.sent) - set(arrived)
        if missing:
            raise RuntimeError(f"the delivery floor lost {len(missing)} of {len(self.sent)} notifications")
        return arrival_summary({i: (call, returned, arrived[i]) for i, (call, returned) in self.sent.items()})


@contextmanager
def delivery(database_url: str) -> Iterator[Delivery]:
    """The relay and the receiving process for the block, on `database_url`'s server (whose
    database holds bench/floor.py's SCHEMA), ready: rows sent now arrive."""
    port = free_port()
    relay = subprocess.Popen([sys.executable, "-m", "bench.latency_floor", "relay", str(port), database_url],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    receiver = None
    try:
        wait_for(lambda: listening(port), 30, "the delivery floor's relay")
        receiver = subprocess.Popen([sys.executable, "-m", "bench.latency_floor", "receive", f"127.0.0.1:{port}"],
                                    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if (receiver.stdout is None or not select.select([receiver.stdout], [], [], 30)[0]
                or receiver.stdout.readline().strip() != READY):
            raise RuntimeError("the delivery floor's receiver did not start")
        with psycopg.connect(database_url, autocommit=True) as conn:
            yield Delivery(conn, receiver)
    finally:
        for proc in (receiver, relay):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(10)


if __name__ == "__main__":
    if sys.argv[1:2] == ["relay"] and len(sys.argv) == 4:
        asyncio.run(_relay(int(sys.argv[2]), sys.argv[3]))
    elif sys.argv[1:2] == ["receive"] and len(sys.argv) == 3:
        print(json.dumps(asyncio.run(_receive(sys.argv[2]))), flush=True)
    else:
        raise SystemExit("usage: python -m bench.latency_floor relay PORT CONNINFO | receive ADDRESS")
