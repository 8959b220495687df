"""An example worker: `python examples/worker.py` (make run starts one).

Handles tasks on the `default`, `emails`, `reports` and `billing` queues.
"""

import asyncio
import logging
import os
import random

from valka_sdk import NonRetryableError, Worker

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

worker = Worker(
    os.environ.get("VALKA_WORKER_SERVER", "127.0.0.1:50051"),
    queues=os.environ.get("VALKA_WORKER_QUEUES", "default,emails,reports,billing").split(","),
    concurrency=int(os.environ.get("VALKA_WORKER_CONCURRENCY", "8")),
    name="example-worker",
    token=os.environ.get("VALKA_WORKER_TOKEN") or None,
)


@worker.task("send_email")
async def send_email(ctx):
    to = (ctx.input or {}).get("to", "nobody@example.com")
    ctx.log("sending email", to=to, attempt=ctx.attempt)
    await asyncio.sleep(0.1)
    return {"sent_to": to}


@worker.task("send_report")
def send_report(ctx):
    """A plain function: runs in a thread."""
    ctx.log("building report")
    return {"pages": random.randint(1, 10)}


@worker.task("charge_card")
async def charge_card(ctx):
    ctx.log("charging", order=(ctx.input or {}).get("order"))
    return {"charged": True}


@worker.task("flaky")
async def flaky(ctx):
    """Fails twice, then succeeds: shows retries with backoff."""
    if ctx.attempt < 3:
        raise RuntimeError(f"transient failure on attempt {ctx.attempt}")
    return {"attempts": ctx.attempt}


@worker.task("always_fails")
async def always_fails(ctx):
    raise RuntimeError("this task always fails; it ends in the dead letter queue")


@worker.task("invalid")
async def invalid(ctx):
    raise NonRetryableError("bad input: not retrying")


if __name__ == "__main__":
    worker.run()
