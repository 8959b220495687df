"""Reads behind the admin's overview, its list filters and `/metrics`.

The tasks table holds millions of finished rows, so nothing here counts it
whole. Each query walks an index for a bounded number of entries:

- distinct values (queues, task names) are a "loose index scan": a recursive
  query that jumps from one value to the next, one index probe per value;
- counts by queue × status probe `tasks_queue_status_idx` once per pair that
  exists and count at most `COUNT_CAP` entries of each; a bigger count is shown
  as the planner's estimate ("≈198k");
- queue lag reads the head of each (queue, PENDING, priority) range of
  `tasks_queue_status_idx`, whose next column is `run_at`;
- throughput comes from `task_counters` and the deltas a statement trigger on
  tasks appends (tasks/sql/schema/counters.sql), both small because the
  scheduler's counter fold moves the deltas every few seconds and folds old
  minutes into one total row.

Nothing here writes: the overview and /metrics are read-only.

The statements are in tasks/sql/dashboard.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from django.core.paginator import Paginator
from django.db import connection, transaction
from django.utils import timezone

from tasks.sql import dashboard as sql
from tasks.sql import queues as queues_sql
from tasks.states import TaskStatus

COUNT_CAP = 10_000
CHART_KINDS = ("completed", "failed", "dead_lettered")
COUNTER_KINDS = ("created", "completed", "failed", "retried", "dead_lettered", "cancelled")

def _rows(statement: str, params: Any = None, *, jit: bool = True) -> list[tuple]:
    if jit:
        with connection.cursor() as cursor:
            cursor.execute(statement, params or {})
            return cursor.fetchall()
    # The planner prices a capped count as if it read the whole index and would JIT-compile
    # it (tens of milliseconds) for a query that itself takes a few.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.JIT_OFF)
        cursor.execute(statement, params or {})
        return cursor.fetchall()


def distinct_values(*, table: str, column: str, limit: int = 200) -> list[str]:
    """Distinct values of an indexed column; `table` and `column` must be code constants."""
    return [row[0] for row in _rows(sql.LOOSE_DISTINCT.format(table=table, column=column), {"limit": limit})]


def queue_names(*, limit: int = 200) -> list[str]:
    return distinct_values(table="tasks", column="queue", limit=limit)


def status_counts(*, cap: int | None = COUNT_CAP, statuses: list[str] | None = None,
                  limit: int = 2000) -> dict[str, dict[str, int]]:
    """{queue: {status: count}}; a count equal to `cap` means "at least cap".

    Each count is a range scan of `tasks_queue_status_idx` for one (queue, status),
    so with `cap=None` its cost follows that count, not the table: exact counts of
    the active statuses stay cheap however many tasks have finished.
    """
    counts: dict[str, dict[str, int]] = {}
    params = {"cap": cap, "limit": limit, "statuses": statuses}
    for queue, status, n in _rows(sql.STATUS_COUNTS, params, jit=False):
        counts.setdefault(queue, {})[status] = n
    return counts


def queue_lag(*, now: datetime | None = None) -> dict[str, float | None]:
    """{queue: seconds the oldest due PENDING task has waited}, None when nothing is due."""
    return {queue: (float(lag) if lag is not None else None) for queue, lag in _rows(sql.QUEUE_LAG, {"now": now})}


def connected_workers(*, limit: int = 500) -> list[dict[str, Any]]:
    """Connected workers with `in_flight` (RUNNING runs) and `free` (concurrency minus those)."""
    columns = ["id", "name", "queues", "concurrency", "node_id", "connected_at", "last_heartbeat_at", "in_flight"]
    workers = [dict(zip(columns, row, strict=True)) for row in _rows(sql.CONNECTED_WORKERS, {"limit": limit})]
    for worker in workers:
        worker["free"] = max(worker["concurrency"] - worker["in_flight"], 0)
    return workers


def throughput(*, now: datetime | None = None, minutes: int = 60,
               kinds: tuple[str, ...] = CHART_KINDS) -> list[tuple[datetime, dict[str, int]]]:
    """Counts per minute of the last `minutes`, oldest first, with a zero for every quiet minute."""
    seen: dict[datetime, dict[str, int]] = {}
    for minute, kind, n in _rows(sql.THROUGHPUT, {"now": now, "minutes": minutes, "kinds": list(kinds)}):
        seen.setdefault(minute, {})[kind] = n
    end = (now or timezone.now()).replace(second=0, microsecond=0)
    slots = [end - timedelta(minutes=i) for i in range(minutes - 1, -1, -1)]
    return [(slot, {kind: seen.get(slot, {}).get(kind, 0) for kind in kinds}) for slot in slots]


def counter_totals() -> dict[tuple[str, str], int]:
    return {(queue, kind): n for queue, kind, n in _rows(sql.COUNTER_TOTALS)}


def table_estimate(table: str) -> int:
    rows = _rows(sql.RELTUPLES, {"table": table})
    return int(rows[0][0]) if rows and rows[0][0] is not None else -1


def planner_estimate(statement: str, params: Any) -> int:
    """How many rows PostgreSQL expects `statement` to return (EXPLAIN only: nothing is read)."""
    plan = _rows(sql.EXPLAIN.format(statement=statement), params)[0][0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return int(plan[0]["Plan"]["Plan Rows"])


def compact(n: int) -> str:
    """12, 9.8k, 198k, 1.2M."""
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def chart(series: list[tuple[datetime, dict[str, int]]], *, width: int = 720, height: int = 140) -> dict[str, Any]:
    """Geometry of a stacked bar chart (one bar per minute) for the overview's inline SVG."""
    top = max([sum(counts.values()) for _, counts in series] + [1])
    slot = width / max(len(series), 1)
    bars = []
    for i, (minute, counts) in enumerate(series):
        y = float(height)
        segments = []
        for kind, n in counts.items():
            h = height * n / top
            y -= h
            segments.append({"kind": kind, "n": n, "y": round(y, 2), "h": round(h, 2)})
        label = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in counts.items())
        bars.append({"x": round(i * slot + 1, 2), "w": round(max(slot - 2, 1), 2), "segments": segments,
                     "title": f"{minute:%H:%M} UTC: {label}"})
    totals = {kind: sum(counts.get(kind, 0) for _, counts in series) for kind in CHART_KINDS}
    return {"width": width, "height": height, "top": top, "bars": bars, "totals": totals}


def limits_text(*, max_running: int | None, rate_limit: int | None, rate_period_seconds: int,
                max_running_per_key: int | None) -> str:
    """A queue's limits as the console shows them: "5 running · 20 per 1 s · 2 per key", or "—"."""
    parts = []
    if max_running is not None:
        parts.append(f"{max_running} running")
    if rate_limit is not None:
        parts.append(f"{rate_limit} per {rate_period_seconds} s")
    if max_running_per_key is not None:
        parts.append(f"{max_running_per_key} per key")
    return " · ".join(parts) or "—"


def queue_controls(names: list[str]) -> dict[str, dict[str, Any]]:
    """{queue: {"paused": its pause is in force, "paused_until", "limits": limits_text}} for the
    queues of `names` that have a row."""
    columns = ["name", "paused_now", "paused_until", "max_running", "rate_limit", "rate_period_seconds",
               "max_running_per_key"]
    statement = f"SELECT {', '.join(columns)} FROM ({queues_sql.QUEUE_ROWS}) q"
    controls = {}
    for name, paused, until, max_running, rate_limit, period, per_key in _rows(statement, {"names": names}):
        controls[name] = {"paused": paused, "paused_until": until if paused else None,
                          "limits": limits_text(max_running=max_running, rate_limit=rate_limit,
                                                rate_period_seconds=period, max_running_per_key=per_key)}
    return controls


def age(seconds: float | None) -> str:
    """A short human duration: 850 ms, 12 s, 4 min, 3.5 h, 2.0 d."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def overview(*, now: datetime | None = None) -> dict[str, Any]:
    """Everything the overview page shows, in a handful of bounded queries."""
    counts = status_counts(cap=COUNT_CAP)
    lag = queue_lag(now=now)
    workers = connected_workers()
    statuses = [s.value for s in TaskStatus]
    rows = []
    names = sorted(set(counts) | set(lag))
    controls = queue_controls(names)
    for queue in names:
        cells = [{"status": s, "n": counts.get(queue, {}).get(s, 0)} for s in statuses]
        for cell in cells:
            cell["label"] = str(cell["n"])
            if cell["n"] >= COUNT_CAP:
                estimate = planner_estimate(sql.CELL, {"queue": queue, "status": cell["status"]})
                cell["label"] = f"≈{compact(max(estimate, COUNT_CAP))}"
        control = controls.get(queue, {"paused": False, "paused_until": None, "limits": "—"})
        rows.append({"queue": queue, "cells": cells, "lag": age(lag.get(queue)), "lagging": bool(lag.get(queue)),
                     **control})
    return {
        "statuses": statuses,
        "rows": rows,
        "workers": workers,
        "slots": {"total": sum(w["concurrency"] for w in workers), "free": sum(w["free"] for w in workers)},
        "chart": chart(throughput(now=now)),
        "cap": COUNT_CAP,
    }


class EstimatedCountPaginator(Paginator):
    """A paginator that never counts a million rows to draw a page.

    It asks PostgreSQL first: pg_class.reltuples for the whole table, the planner's
    estimate (EXPLAIN) for a filtered one. Above `cap` that estimate is the count;
    below it the rows are counted exactly, at most `cap` + 1 of them.
    """

    cap = 10_000

    @cached_property
    def count(self) -> int:
        return bounded_count(self.object_list, self.cap)[0]


def bounded_count(qs: Any, cap: int = COUNT_CAP) -> tuple[int, bool]:
    """(count, exact) of a queryset's rows, reading at most `cap` + 1 of them.

    PostgreSQL is asked first: pg_class.reltuples for a whole table, the planner's estimate
    (EXPLAIN) for a filtered one. Above `cap` that estimate is the answer; below, the rows are
    counted, at most `cap` + 1, and a count past `cap` is answered with the estimate (at
    least `cap` + 1)."""
    qs = qs.order_by()
    if not qs.query.where:
        estimate = table_estimate(qs.model._meta.db_table)
    else:
        statement, params = qs.values("pk").query.sql_with_params()
        estimate = planner_estimate(statement, params)
    if estimate > cap:
        return estimate, False
    exact = qs[: cap + 1].count()
    return (exact, True) if exact <= cap else (max(cap + 1, estimate), False)
