"""Resident memory of the dispatcher and of a worker, and of the dispatcher holding many idle workers."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import psycopg

from bench.measure import bar
from bench.stack import ROOT, BenchStack, rss_kib, wait_for

IDLE_QUEUE = "idle"


def many_workers(stack: BenchStack, dispatcher: subprocess.Popen, addr: str, count: int) -> dict[str, Any]:
    """Connect `count` idle worker sessions (one process, one TCP connection each) and read the
    dispatcher's RSS once the database lists them all as CONNECTED."""
    before = rss_kib(dispatcher.pid)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bench.fake_workers", addr, str(count), IDLE_QUEUE],
                            cwd=ROOT, env=stack.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        with psycopg.connect(stack.database_url, autocommit=True) as conn, \
                bar(count, f"connect {count} idle workers", unit="worker") as progress:
            def connected() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError("the idle workers' process exited")
                row = conn.execute("SELECT count(*) FROM workers WHERE status = 'CONNECTED' "
                                   "AND name LIKE 'idle-%%'").fetchone()
                n = row[0] if row else 0
                progress.update(n - progress.n)
                return n >= count

            wait_for(connected, 180, f"{count} idle workers", interval=0.25)
        seconds = time.perf_counter() - start
        time.sleep(1.0)
        during = rss_kib(dispatcher.pid)
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return {"workers": count, "dispatcher_rss_before_mib": before / 1024, "dispatcher_rss_mib": during / 1024,
            "per_worker_kib": (during - before) / count, "connect_seconds": seconds}


def rss(procs: dict[str, subprocess.Popen]) -> dict[str, float]:
    return {name: rss_kib(proc.pid) / 1024 for name, proc in procs.items()}
