"""Many idle workers from one process: `python -m bench.fake_workers ADDR COUNT QUEUE`.

Each is a real WorkerService session on a channel (and TCP connection) of its
own that says hello and then only listens, which is what the dispatcher holds
for an idle worker. Prints "connected N" once every stream is open; runs
until stdin closes or SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid

import grpc

from valka_sdk.v1 import worker_pb2 as pb
from valka_sdk.v1 import worker_pb2_grpc

# Without a local subchannel pool, channels to one target share a single TCP connection.
OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


async def session(addr: str, queue: str, index: int, opened: asyncio.Queue, stop: asyncio.Event) -> None:
    async with grpc.aio.insecure_channel(addr, options=OPTIONS) as channel:
        call = worker_pb2_grpc.WorkerServiceStub(channel).Session()
        await call.write(pb.WorkerRequest(hello=pb.WorkerHello(
            worker_id=str(uuid.uuid4()), worker_name=f"idle-{index}", queues=[queue], concurrency=1,
            metadata=json.dumps({"bench": "idle"}))))
        await call.initial_metadata()
        await opened.put(index)
        reader = asyncio.ensure_future(_drain(call))
        await stop.wait()
        reader.cancel()
        call.cancel()


async def _drain(call) -> None:
    while await call.read() is not grpc.aio.EOF:
        pass


async def main(addr: str, count: int, queue: str) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.readline() else None)
    opened: asyncio.Queue = asyncio.Queue()
    sessions = []
    for i in range(count):
        sessions.append(asyncio.ensure_future(session(addr, queue, i, opened, stop)))
        if i % 50 == 49:
            await asyncio.sleep(0.05)  # do not open a thousand TCP connections in one burst
    for _ in range(count):
        await opened.get()
    print(f"connected {count}", flush=True)
    await stop.wait()
    await asyncio.gather(*sessions, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
