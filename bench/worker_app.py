"""A benchmark worker process: `python -m bench.worker_app` (configured by BENCH_* variables).

`noop` does nothing; `stamp` returns the time its handler started, so the
latency workload can subtract the time the task was enqueued.
"""

import logging
import os
import time

from valka_sdk import Worker

logging.basicConfig(level=logging.WARNING)

worker = Worker(
    os.environ["BENCH_SERVER"],
    queues=os.environ.get("BENCH_QUEUES", "drain").split(","),
    concurrency=int(os.environ.get("BENCH_CONCURRENCY", "32")),
    name=os.environ.get("BENCH_NAME", "bench"),
    drain_timeout=5.0,
)


@worker.task("stamp")
async def stamp(ctx):
    return {"started": time.time()}


@worker.task("noop")
async def noop(ctx):
    return None


if __name__ == "__main__":
    worker.run()
