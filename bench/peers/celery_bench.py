"""Celery+Redis: the workloads of `bench.drain` and `bench.enqueue`, the Celery way.

One worker process (prefork, `-c 2` children by default) consumes `latency` from the
start; each drain round fills a queue of its own while nobody consumes it, then asks
the worker to consume it (`add_consumer`) and counts from the reply. A task is done
when its result is in the result backend; its `date_done` is when it finished.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from bench.measure import bar, latency_summary, paced, rounds_summary, stop, wait_until_done

HOSTNAME = "bench@localhost"


def _finished_at(r: redis.Redis, ids: list[str]) -> list[float]:
    times = []
    for start in range(0, len(ids), 1000):
        for raw in r.mget([f"celery-task-meta-{i}" for i in ids[start:start + 1000]]):
            if raw is None:
                continue
            done = datetime.fromisoformat(json.loads(raw)["date_done"])
            times.append((done if done.tzinfo else done.replace(tzinfo=UTC)).timestamp())
    return times


def enqueue(redis_url: str, count: int) -> dict[str, Any]:
    """One apply_async after another; nobody consumes the queue, which is emptied afterwards.

    Also run alone (`python -m bench.peers.run celery-enqueue`), in turns with Valka's in-process
    enqueue (bench/enqueue.py `in_process_in_turns`)."""
    os.environ["BENCH_REDIS_URL"] = redis_url
    from bench.peers.celery_app import noop

    with bar(count, "celery enqueue x1") as progress:
        start = time.perf_counter()
        for i in range(count):
            noop.apply_async(kwargs={"i": i}, queue="enqueue")
            progress.update(1)
        seconds = time.perf_counter() - start
    redis.Redis.from_url(f"{redis_url}/0").delete("enqueue")
    return {"rate_per_s": count / seconds, "count": count}


def run(args: Any, workdir: Path) -> dict[str, Any]:
    os.environ["BENCH_REDIS_URL"] = args.redis_url
    from bench.peers.celery_app import app, noop, stamp

    env = dict(os.environ)
    results = redis.Redis.from_url(f"{args.redis_url}/1")
    out: dict[str, Any] = {"worker": f"prefork -c {args.celery_concurrency}"}

    out["enqueue_single"] = enqueue(args.redis_url, args.enqueue_count)

    log = open(workdir / "celery-worker.log", "ab")  # noqa: SIM115 (closed below)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "bench.peers.celery_app", "worker", "-P", "prefork",
         "-c", str(args.celery_concurrency), "-Q", "latency", "-n", HOSTNAME, "--loglevel", "WARNING",
         "--without-gossip", "--without-mingle"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=[HOSTNAME], timeout=0.5):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the Celery worker did not start")
        out["worker_rss_mib"] = _rss_mib(worker.pid)

        rates = []
        for r in range(args.rounds):
            queue = f"drain-{r}"
            results.flushdb()
            with bar(args.n, f"celery fill {r + 1}/{args.rounds}") as progress:
                ids = []
                for _ in range(args.n):
                    ids.append(noop.apply_async(queue=queue).id)
                    progress.update(1)
            app.control.add_consumer(queue, destination=[HOSTNAME], reply=True)
            t0 = time.time()
            wait_until_done(lambda: results.dbsize(), args.n, f"celery drain {r + 1}/{args.rounds}",
                            max(120.0, args.n / 20))
            rates.append(args.n / (max(_finished_at(results, ids)) - t0))
            app.control.cancel_consumer(queue, destination=[HOSTNAME], reply=True)
        out["drain"] = rounds_summary(rates, n=args.n)
        out["worker_rss_after_mib"] = _rss_mib(worker.pid)

        results.flushdb()
        sent: dict[str, tuple[float, float]] = {}

        def send(_: int) -> None:
            before = time.time()
            task_id = stamp.apply_async(queue="latency").id
            sent[task_id] = (before, time.time())

        paced(args.latency_count, args.latency_rate, f"celery latency ({args.latency_rate:.0f}/s)", send)
        ids = list(sent)
        wait_until_done(lambda: results.dbsize(), len(ids), "celery latency (finishing)", 60)
        started = {}
        for task_id in ids:
            raw = results.get(f"celery-task-meta-{task_id}")
            started[task_id] = json.loads(raw)["result"]  # type: ignore[arg-type]
        out["latency"] = {**latency_summary([(started[i] - sent[i][1]) * 1000 for i in ids]),
                          "from_call": latency_summary([(started[i] - sent[i][0]) * 1000 for i in ids])}
    finally:
        stop(worker)
        log.close()
    return out


def _rss_mib(pid: int) -> float:
    """RSS of the worker process and its children (prefork), from /proc."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024
