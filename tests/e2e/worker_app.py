"""A worker process for the end-to-end tests: `python -m tests.e2e.worker_app`.

Configured by environment (VALKA_TEST_SERVER, VALKA_TEST_QUEUES, VALKA_TEST_CONCURRENCY,
VALKA_TEST_HEARTBEAT, VALKA_TEST_NAME, VALKA_TEST_WORKER_ID, VALKA_TEST_RECONNECT_MAX; for TLS,
VALKA_TEST_TLS_CA, the CA's PEM file, and for mutual TLS VALKA_TEST_TLS_CERT and VALKA_TEST_TLS_KEY).
Handlers do what their input asks, and report what they saw through files under
`input["mark"]` when given.
"""

import asyncio
import logging
import os
import time
from pathlib import Path

import grpc

from valka_sdk import NonRetryableError, Worker

logging.basicConfig(level=logging.WARNING)


def tls_credentials() -> grpc.ChannelCredentials | bool:
    def pem(name: str) -> bytes | None:
        path = os.environ.get(name)
        return Path(path).read_bytes() if path else None

    if not os.environ.get("VALKA_TEST_TLS_CA"):
        return False
    return grpc.ssl_channel_credentials(root_certificates=pem("VALKA_TEST_TLS_CA"),
                                        private_key=pem("VALKA_TEST_TLS_KEY"),
                                        certificate_chain=pem("VALKA_TEST_TLS_CERT"))


worker = Worker(
    os.environ["VALKA_TEST_SERVER"],
    queues=os.environ.get("VALKA_TEST_QUEUES", "default").split(","),
    concurrency=int(os.environ.get("VALKA_TEST_CONCURRENCY", "4")),
    name=os.environ.get("VALKA_TEST_NAME", "e2e"),
    heartbeat_interval=float(os.environ.get("VALKA_TEST_HEARTBEAT", "30")),
    drain_timeout=float(os.environ.get("VALKA_TEST_DRAIN", "10")),
    token=os.environ.get("VALKA_TEST_TOKEN") or None,
    worker_id=os.environ.get("VALKA_TEST_WORKER_ID") or None,
    reconnect_max_delay=float(os.environ.get("VALKA_TEST_RECONNECT_MAX", "10")),
    tls=tls_credentials(),
)


def mark(ctx, what: str) -> None:
    folder = ctx.input.get("mark") if isinstance(ctx.input, dict) else None
    if folder:
        Path(folder, f"{ctx.task_id}.{what}.{ctx.attempt}.{os.getpid()}").touch()


@worker.task("echo")
async def echo(ctx):
    mark(ctx, "ran")
    return {"echo": ctx.input, "attempt": ctx.attempt, "worker": worker.name}


@worker.task("sync_echo")
def sync_echo(ctx):
    ctx.log("sync handler ran", thread=True)
    return {"echo": ctx.input}


@worker.task("sleep")
async def sleep(ctx):
    mark(ctx, "started")
    ctx.log("sleeping", seconds=ctx.input["seconds"])
    try:
        await asyncio.sleep(ctx.input["seconds"])
    except asyncio.CancelledError:
        mark(ctx, "cancelled")
        raise
    mark(ctx, "finished")
    return {"slept": ctx.input["seconds"], "attempt": ctx.attempt}


@worker.task("sync_sleep")
def sync_sleep(ctx):
    deadline = time.monotonic() + ctx.input["seconds"]
    while time.monotonic() < deadline:
        if ctx.cancelled:
            mark(ctx, "cancelled")
            return {"stopped": True}
        time.sleep(0.02)
    return {"slept": ctx.input["seconds"]}


@worker.task("fail_until")
async def fail_until(ctx):
    mark(ctx, "ran")
    if ctx.attempt < ctx.input["succeed_on"]:
        raise RuntimeError(f"failing attempt {ctx.attempt}")
    return {"succeeded_on": ctx.attempt}


@worker.task("always_fail")
async def always_fail(ctx):
    mark(ctx, "ran")
    raise RuntimeError("always fails")


@worker.task("fatal")
async def fatal(ctx):
    raise NonRetryableError("not worth retrying")


@worker.task("logs")
async def logs(ctx):
    for i in range(ctx.input.get("lines", 3)):
        ctx.log(f"line {i}", i=i)
    ctx.warn("careful")
    ctx.error("bad thing")
    return {"logged": True}


@worker.task("big_output")
async def big_output(ctx):
    return "x" * ctx.input["bytes"]


@worker.task("many_logs")
async def many_logs(ctx):
    """Logs `lines` lines of `bytes` bytes as fast as it can, once the file `gate` exists if given."""
    mark(ctx, "started")
    gate = ctx.input.get("gate")
    while gate and not Path(gate).exists():
        await asyncio.sleep(0.05)
    for i in range(ctx.input["lines"]):
        ctx.log(f"{i:06d} " + "y" * ctx.input["bytes"])
        if i % 500 == 0:
            await asyncio.sleep(0)  # let the worker send while it logs
    return {"logged": ctx.input["lines"]}


@worker.task("collect_signals")
async def collect_signals(ctx):
    """Waits for `gate` (a file) if given on attempt 1, then takes `count` signals."""
    mark(ctx, "started")
    gate = ctx.input.get("gate")
    if gate and ctx.attempt == 1:
        while not Path(gate).exists():
            await asyncio.sleep(0.02)
    got = []
    async for signal in ctx.signals():
        got.append({"id": signal.id, "type": signal.type, "payload": signal.payload})
        if len(got) == ctx.input["count"]:
            break
    return {"signals": got, "attempt": ctx.attempt, "worker": worker.name}


if __name__ == "__main__":
    worker.run()
