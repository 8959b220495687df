"""CPU time that each process of a workload spends, from /proc: where a drain's cost goes.

The drain is held to the gRPC floor, whose two processes carry the same messages with nothing
else to do. Both keep the two cores busy, so the ratio of their rates is about the ratio of the
CPU each spends per task; counting that CPU by process says which side the difference lies in.

PostgreSQL is counted whole: the postmaster, its live children, and what its children that
ended in between spent (the postmaster's own count of reaped children), so a backend or an
autovacuum worker that comes and goes within a round is not lost.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path

import psycopg

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def seconds(pid: int, *, children: bool = False) -> float:
    """CPU seconds (user + system) of `pid`, all its threads; with `children`, also those of its
    children that ended and were reaped. 0.0 once it is gone."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / TICKS


def postmaster(database_url: str) -> int:
    """The pid of the postmaster serving `database_url`: the parent of a backend of ours."""
    with psycopg.connect(database_url) as conn:  # read while the backend is alive
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        fields = _stat(backend)
    if fields is None:
        raise RuntimeError(f"backend {backend} of {database_url} is not visible in /proc")
    return int(fields[1])  # ppid


def postgres_seconds(master: int) -> float:
    """CPU seconds of a PostgreSQL server: the postmaster, its live children and its reaped ones."""
    total = seconds(master, children=True)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == master:
                total += seconds(int(entry.name))
    return total


def sampler(groups: dict[str, Iterable[int]], *, postgres: int | None = None) -> Callable[[], dict[str, float]]:
    """A function that answers the CPU seconds spent so far by each group of pids (and, under
    "postgres", by the server whose postmaster is `postgres`). Two calls' difference is a round's."""
    fixed = {name: list(pids) for name, pids in groups.items()}

    def sample() -> dict[str, float]:
        out = {name: sum(seconds(pid) for pid in pids) for name, pids in fixed.items()}
        if postgres is not None:
            out["postgres"] = postgres_seconds(postgres)
        return out

    return sample


def per_task(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    """Microseconds of CPU per task, by group, between two samples."""
    return {name: (after[name] - before[name]) * 1e6 / n for name in after}


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each group's median over the rounds, and the median of the rounds' totals."""
    if not rounds:
        return {}
    out = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    out["total"] = statistics.median(sum(r.values()) for r in rounds)
    return out
