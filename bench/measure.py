"""Small measuring helpers shared by Valka's workloads and the peers' (standard library and tqdm only)."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tqdm import tqdm

PROGRESS = True  # the smoke test turns the bars off


def bar(total: int, desc: str, unit: str = "task") -> tqdm:
    return tqdm(total=total, desc=f"{desc:<28}", unit=unit, unit_scale=True, leave=False, file=sys.stderr,
                disable=not PROGRESS, dynamic_ncols=True)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of `values`."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_summary(ms: Sequence[float]) -> dict[str, Any]:
    return {"p50_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90), "p99_ms": percentile(ms, 99),
            "max_ms": max(ms) if ms else math.nan, "mean_ms": statistics.fmean(ms) if ms else math.nan,
            "samples": len(ms)}


def arrival_summary(moments: Mapping[Any, tuple[float, float, float]]) -> dict[str, Any]:
    """p50/p99 of arrival − return, and of arrival − call under "from_call", in ms, from each
    sample's (call, return, arrival) in seconds: the latency figures and the delivery floor's."""
    from_return = [(arrived - returned) * 1000 for _, returned, arrived in moments.values()]
    from_call = [(arrived - call) * 1000 for call, _, arrived in moments.values()]
    return {**latency_summary(from_return), "from_call": latency_summary(from_call)}


def rounds_summary(rates: Sequence[float], **extra: Any) -> dict[str, Any]:
    return {"rate_per_s": statistics.median(rates), "rounds": list(rates), **extra}


def wait_until_done(count_done: Callable[[], int], total: int, desc: str, timeout: float,
                    interval: float = 0.2) -> None:
    """Poll `count_done()` with a progress bar until it reaches `total`."""
    deadline = time.monotonic() + timeout
    with bar(total, desc) as progress:
        while True:
            done = count_done()
            progress.update(done - progress.n)
            if done >= total:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{desc}: {done} of {total} done after {timeout:.0f}s")
            time.sleep(interval)


def paced(count: int, rate: float, desc: str, send: Callable[[int], None]) -> None:
    """Call send(i) `count` times at about `rate` per second."""
    interval = 1.0 / rate
    start = time.monotonic()
    with bar(count, desc) as progress:
        for i in range(count):
            delay = start + i * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            send(i)
            progress.update(1)


def stop(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if `proc` is still there after `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
