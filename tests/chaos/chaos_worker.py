"""A worker for the chaos run: `python -m tests.chaos.chaos_worker`.

Every execution is recorded in the side table `chaos_executions` (start and
the output it returns), so the checks can compare what handlers did with what
the queue says happened. Configured by CHAOS_SERVERS, CHAOS_DSN, CHAOS_NAME.
"""

import asyncio
import logging
import os

import psycopg
from psycopg.types.json import Jsonb

from valka_sdk import NonRetryableError, Worker

logging.basicConfig(level=logging.WARNING)

worker = Worker(os.environ["CHAOS_SERVERS"], queues=["chaos"], concurrency=int(os.environ.get("CHAOS_C", "8")),
                name=os.environ.get("CHAOS_NAME", "chaos"), heartbeat_interval=2.0, drain_timeout=5.0)
DSN = os.environ["CHAOS_DSN"]
_conn: psycopg.AsyncConnection | None = None


async def record(ctx, phase: str, output=None) -> None:
    """Write to the side table; a database outage makes the attempt fail (retryably)."""
    global _conn
    for attempt in range(2):
        try:
            if _conn is None or _conn.closed:
                _conn = await psycopg.AsyncConnection.connect(DSN, autocommit=True, connect_timeout=5)
            await _conn.execute(
                "INSERT INTO chaos_executions (task_id, run_id, attempt, worker, pid, phase, output)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (ctx.task_id, ctx.run_id, ctx.attempt, worker.name, os.getpid(), phase,
                 None if output is None else Jsonb(output)))
            return
        except psycopg.OperationalError:
            _conn = None
            if attempt:
                raise


@worker.task("chaos")
async def chaos(ctx):
    spec = ctx.input
    await record(ctx, "start")
    await asyncio.sleep(spec["sleep_ms"] / 1000)
    kind = spec["kind"]
    if kind == "fatal":
        raise NonRetryableError("fatal by design")
    if kind == "exhaust" or (kind == "flaky" and ctx.attempt < 2):
        raise RuntimeError(f"{kind} failure on attempt {ctx.attempt}")
    output = {"i": spec["i"], "double": spec["i"] * 2, "attempt": ctx.attempt, "run": ctx.run_id}
    await record(ctx, "done", output)
    return output


if __name__ == "__main__":
    worker.run()
