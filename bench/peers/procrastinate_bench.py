"""Procrastinate: the workloads of `bench.drain` and `bench.enqueue`, the Procrastinate way.

Its own database on the benchmark's PostgreSQL. One worker process (`-c 8` by default)
listening to every queue; each drain round defers N jobs with one `batch_defer`
(one statement, so they appear together) into a queue of its own and counts from
its return. A job is done when its `succeeded` event is written.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.measure import bar, latency_summary, rounds_summary, stop, wait_until_done


def run(args: Any, workdir: Path) -> dict[str, Any]:
    url = args.procrastinate_url
    stamps = workdir / "procrastinate-stamps.txt"
    os.environ.update(BENCH_PROCRASTINATE_URL=url, BENCH_STAMPS=str(stamps))
    env = dict(os.environ)
    from bench.peers.procrastinate_app import app, noop, stamp

    subprocess.run([sys.executable, "-m", "procrastinate", "--app", "bench.peers.procrastinate_app.app",
                    "schema", "--apply"], env=env, check=True, capture_output=True)
    out: dict[str, Any] = {"worker": f"-c {args.procrastinate_concurrency}"}

    async def enqueue() -> None:
        async with app.open_async():
            with bar(args.enqueue_count, "procrastinate enqueue x1") as progress:
                start = time.perf_counter()
                for i in range(args.enqueue_count):
                    await noop.configure(queue="enqueue").defer_async(i=i)
                    progress.update(1)
                seconds = time.perf_counter() - start
            out["enqueue_single"] = {"rate_per_s": args.enqueue_count / seconds, "count": args.enqueue_count}
            batch = [{"i": i} for i in range(1000)]
            with bar(args.batches * 1000, "procrastinate batch of 1000") as progress:
                start = time.perf_counter()
                for _ in range(args.batches):
                    await noop.configure(queue="enqueue").batch_defer_async(*batch)
                    progress.update(1000)
                seconds = time.perf_counter() - start
            out["enqueue_batch"] = {"rate_per_s": args.batches * 1000 / seconds, "batch_size": 1000}

    asyncio.run(enqueue())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM procrastinate_jobs WHERE queue_name = 'enqueue'")

    log = open(workdir / "procrastinate-worker.log", "ab")  # noqa: SIM115 (closed below)
    worker = subprocess.Popen(
        [sys.executable, "-m", "procrastinate", "--app", "bench.peers.procrastinate_app.app", "--log-level",
         "warning", "worker", "-c", str(args.procrastinate_concurrency), "-q", ""],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            def running() -> bool:
                if worker.poll() is not None:
                    raise RuntimeError("the Procrastinate worker exited")
                row = conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone()
                return bool(row and row[0])

            wait_until_done(lambda: int(running()), 1, "procrastinate worker", 60)
            out["worker_rss_mib"] = _rss_mib(worker.pid)
            rates = []
            for r in range(args.rounds):
                queue = f"drain-{r}"
                t0 = asyncio.run(_fill(app, noop, queue, args.n))
                wait_until_done(lambda q=queue: conn.execute(
                    "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s AND status = 'succeeded'",
                    (q,)).fetchone()[0], args.n, f"procrastinate drain {r + 1}/{args.rounds}",  # type: ignore[index]
                    max(120.0, args.n / 20))
                last = conn.execute(
                    "SELECT max(e.at) FROM procrastinate_events e JOIN procrastinate_jobs j ON j.id = e.job_id "
                    "WHERE j.queue_name = %s AND e.type = 'succeeded'", (queue,)).fetchone()[0]  # type: ignore[index]
                rates.append(args.n / (last.timestamp() - t0))
            out["drain"] = rounds_summary(rates, n=args.n)
            out["worker_rss_after_mib"] = _rss_mib(worker.pid)

            sent = asyncio.run(_latency(app, stamp, args.latency_count, args.latency_rate))
            wait_until_done(lambda: len(stamps.read_text().splitlines()) if stamps.exists() else 0, len(sent),
                            "procrastinate latency (finishing)", 60)
            started = {int(a): float(b) for a, b in (line.split() for line in stamps.read_text().splitlines())}
            ids = list(sent)
            out["latency"] = {**latency_summary([(started[i] - sent[i][1]) * 1000 for i in ids]),
                              "from_call": latency_summary([(started[i] - sent[i][0]) * 1000 for i in ids])}
    finally:
        stop(worker)
        log.close()
    return out


async def _fill(app: Any, noop: Any, queue: str, n: int) -> float:
    async with app.open_async():
        await noop.configure(queue=queue).batch_defer_async(*({} for _ in range(n)))
        return time.time()


async def _latency(app: Any, stamp: Any, count: int, rate: float) -> dict[int, tuple[float, float]]:
    sent: dict[int, tuple[float, float]] = {}
    async with app.open_async():
        begin = time.monotonic()
        with bar(count, f"procrastinate latency ({rate:.0f}/s)") as progress:
            for i in range(count):
                delay = begin + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                before = time.time()
                job_id = await stamp.configure(queue="latency").defer_async()
                sent[job_id] = (before, time.time())
                progress.update(1)
    return sent


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
