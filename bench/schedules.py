"""Schedules: one scheduler leader firing a minute's worth of schedules, with the drain beside it,
and the scheduler's CPU over an idle stretch with schedules that are not due.

Fire: N enabled schedules due every minute (`* * * * *`), all at the next minute's slot; a real
`run_scheduler` leads; the figure is the time from the slot until the last of them has fired
(min(next_run_at) past the slot: one index probe per poll). A drain of the drain workload's size
runs so that it overlaps the firing, and a drain just before serves as its baseline.

Idle: N enabled schedules not due for a long while; a fresh `run_scheduler` leads for `seconds`;
the figure is its CPU time (user + system, from /proc) over that stretch, in percent of one core.
It includes the scheduler's other loops, which wake every VALKA_SCHEDULER_MAX_SLEEP.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench import drain
from bench.stack import BenchStack, wait_for

QUEUE = "bench-schedules"  # no worker serves it: the tasks only pile up, and are deleted afterwards
PREFIX = "bench-"

SEED = """
INSERT INTO schedules (name, cron, interval_seconds, timezone, catch_up, enabled, declared, task_name, queue,
                       input, metadata, priority, max_retries, timeout_seconds, next_run_at, fired_count)
SELECT %(prefix)s || g, %(cron)s, %(interval)s, 'UTC', 'latest', true, false, 'noop', %(queue)s,
       jsonb_build_object('n', g), '{}', 0, 3, 300, %(next_run_at)s, 0
FROM generate_series(1, %(count)s) g
"""
EARLIEST = "SELECT min(next_run_at) FROM schedules WHERE enabled AND next_run_at IS NOT NULL"


def cleanup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM schedules WHERE starts_with(name, %s)", (PREFIX,))
        conn.execute("DELETE FROM tasks WHERE queue = %s", (QUEUE,))


def _seed(conn: psycopg.Connection, count: int, *, cron: str | None, interval: int | None,
          next_run_at: datetime) -> None:
    conn.execute(SEED, {"prefix": PREFIX, "cron": cron, "interval": interval, "queue": QUEUE,
                        "next_run_at": next_run_at, "count": count})


def _scheduler(stack: BenchStack, name: str) -> Any:
    proc = stack.spawn(name, [sys.executable, "manage.py", "run_scheduler"], {"VALKA_LOG_LEVEL": "INFO"})
    log = Path(stack.workdir) / f"{name}.log"
    wait_for(lambda: "loops running" in (log.read_text() if log.exists() else "") or proc.poll() is not None,
             60, "the scheduler to lead")
    if proc.poll() is not None:
        raise RuntimeError(f"the scheduler exited:\n{stack.log_tail(proc)}")
    return proc


def fire(stack: BenchStack, *, count: int, drain_n: int, cron: bool = True, lead: float = 15.0) -> dict[str, Any]:
    """Seconds from the slot until `count` schedules have fired, and the drains before, beside and
    after it (beside ÷ the mean of the other two: `beside_ratio`).
    With `cron` the schedules are `* * * * *` and the slot the first minute at least `lead` away;
    without, every 60 s and the slot `lead` from now (a smoke test's short wait)."""
    url = stack.database_url
    cleanup(url)
    baseline = drain.drain(url, n=drain_n, rounds=1, label="drain, before the schedules")
    with psycopg.connect(url, autocommit=True) as conn:
        now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        if cron:
            slot = (now + timedelta(seconds=lead + 60)).replace(second=0, microsecond=0)
        else:
            slot = now + timedelta(seconds=lead)
        _seed(conn, count, cron="* * * * *" if cron else None, interval=None if cron else 60, next_run_at=slot)
        conn.execute("ANALYZE schedules")
    scheduler = _scheduler(stack, "scheduler-fire")
    try:
        done: dict[str, float] = {}

        def watch() -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                while True:
                    earliest = conn.execute(EARLIEST).fetchone()[0]  # type: ignore[index]
                    if earliest is not None and earliest > slot:
                        done["at"] = time.time()
                        return
                    if time.time() > slot.timestamp() + 300:
                        return
                    time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        # The drain's enqueue takes about a second: its tasks are being worked on as the slot comes.
        time.sleep(max(0.0, slot.timestamp() - 1.0 - time.time()))
        beside = drain.drain(url, n=drain_n, rounds=1, label="drain, beside the firing")
        watcher.join(330)
        if "at" not in done:
            raise TimeoutError(f"{count} schedules not fired within 5 minutes of their slot")
        # Once more after the firing: the drain beside it is compared with both, so that the
        # machine's drift over the minute cannot pass for the firing's cost.
        after = drain.drain(url, n=drain_n, rounds=1, label="drain, after the firing")
        with psycopg.connect(url, autocommit=True) as conn:
            fired, lag = conn.execute(
                "SELECT count(*) FILTER (WHERE last_run_at = %s), max(last_lag_seconds) FROM schedules "
                "WHERE starts_with(name, %s)", (slot, PREFIX)).fetchone()  # type: ignore[misc]
    finally:
        stack.stop(scheduler)
        cleanup(url)
    return {"schedules": count, "fired": fired, "seconds": done["at"] - slot.timestamp(),
            "last_batch_began_s": lag, "drain_before": baseline, "drain_beside": beside, "drain_after": after,
            "beside_ratio": beside["rate_per_s"] / ((baseline["rate_per_s"] + after["rate_per_s"]) / 2)}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def idle(stack: BenchStack, *, count: int, seconds: float, settle: float = 5.0) -> dict[str, Any]:
    """The scheduler's CPU (percent of one core) over `seconds` of leading with `count` schedules not due."""
    url = stack.database_url
    cleanup(url)
    with psycopg.connect(url, autocommit=True) as conn:
        _seed(conn, count, cron="0 0 1 1 *", interval=None, next_run_at=datetime(datetime.now(UTC).year + 1, 1, 1,
                                                                                    tzinfo=UTC))
        conn.execute("ANALYZE schedules")
    scheduler = _scheduler(stack, "scheduler-idle")
    try:
        time.sleep(settle)  # past its first passes
        before, start = _cpu_seconds(scheduler.pid), time.monotonic()
        time.sleep(seconds)
        used, elapsed = _cpu_seconds(scheduler.pid) - before, time.monotonic() - start
    finally:
        stack.stop(scheduler)
        cleanup(url)
    return {"schedules": count, "seconds": elapsed, "cpu_seconds": used, "cpu_percent": 100 * used / elapsed}
