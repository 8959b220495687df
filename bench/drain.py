"""Drain and latency on Valka, counted from the database.

Drain: N no-op tasks committed in one transaction while the workers are idle,
then the time until the last of them is COMPLETED: max(finished_at) minus the
moment the commit returned. The same drain runs on queues with controls, in
turns with the unlimited one: one whose max_running is the workers' slots, and
one whose tasks have 100 concurrency keys under max_running_per_key
(`controlled`); and on the first one's bound, a queue without limits whose
results free their slots only once their ends are written. Latency: idle
workers, `stamp` tasks enqueued one by one through the in-process API at a
steady pace; the handler's start time (in the task's output) minus the moment
`enqueue` returned.

These run in a Django-configured process (the benchmark's, or the smoke test's).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench import cpu
from bench.measure import arrival_summary, latency_summary, paced, percentile, rounds_summary, wait_until_done

DRAIN_QUEUE = "drain"
LATENCY_QUEUE = "latency"
CAPPED_QUEUE = "drain_capped"  # max_running = the workers' slots
KEYED_QUEUE = "drain_keyed"  # KEYS concurrency keys, max_running_per_key
# No limit, but its slots free once the ends are written (the dispatcher's VALKA_DISPATCH_HELD_QUEUES).
HELD_QUEUE = "drain_held"
KEYS = 100
CHUNK = 1000


def enqueue_committed(n: int, queue: str, task_name: str = "noop", keys: int = 0) -> float:
    """Insert n tasks in one transaction (batches of 1,000), round-robin over `keys` concurrency
    keys if any; returns time.time() once committed."""
    from django.db import transaction

    from tasks.services import task_enqueue_many

    with transaction.atomic():
        for start in range(0, n, CHUNK):
            task_enqueue_many([{"task_name": task_name, "queue": queue,
                                "concurrency_key": f"key-{i % keys}" if keys else None}
                               for i in range(start, min(start + CHUNK, n))])
    return time.time()


def _completed_since(conn: psycopg.Connection, queue: str, since: datetime) -> tuple[int, datetime | None]:
    # Matches tasks_finished_idx (finished_at WHERE status is final): cheap even beside a million old rows.
    row = conn.execute(
        "SELECT count(*), max(finished_at) FROM tasks "
        "WHERE status = 'COMPLETED' AND finished_at >= %s AND queue = %s", (since, queue)).fetchone()
    assert row is not None
    return row[0], row[1]


def _completed_counter(queue: str) -> int:
    # The trigger-kept counters (a few rows), where counting the COMPLETED tasks themselves
    # reads one row per task: it was a tenth of PostgreSQL's work in a drain.
    from tasks.dashboard import counter_totals

    return counter_totals().get((queue, "completed"), 0)


def drain_round(conn: psycopg.Connection, *, n: int, queue: str = DRAIN_QUEUE, desc: str = "drain",
                timeout: float | None = None, task_name: str = "noop", keys: int = 0,
                sample: Callable[[], dict[str, float]] | None = None, spent: list[dict[str, float]] | None = None,
                ) -> float:
    """One round: n / (last finished_at − commit time). `conn` is a psycopg connection to the
    database Django's default connection reaches, where the tasks are enqueued and counted.
    With `sample` (a bench.cpu sampler), the CPU each group spent per task from the commit until
    the last task was counted is appended to `spent`."""
    since = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    before = _completed_counter(queue)
    t0 = enqueue_committed(n, queue, task_name, keys=keys)
    at_commit = sample() if sample is not None else {}
    wait_until_done(lambda: _completed_counter(queue) - before, n, desc, timeout or max(120.0, n / 50))
    if sample is not None and spent is not None:
        spent.append(cpu.per_task(at_commit, sample(), n))
    done, last = _completed_since(conn, queue, since)
    assert last is not None and done == n
    return n / max(last.timestamp() - t0, 1e-6)


def drain(database_url: str, *, n: int, rounds: int, queue: str = DRAIN_QUEUE, label: str = "drain",
          timeout: float | None = None, task_name: str = "noop", keys: int = 0) -> dict[str, Any]:
    """Median over `rounds` of n / (last finished_at − commit time)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rates = [drain_round(conn, n=n, queue=queue, desc=f"{label} {r + 1}/{rounds}", timeout=timeout,
                             task_name=task_name, keys=keys) for r in range(rounds)]
    return rounds_summary(rates, n=n)


def drain_in_turns(database_url: str, *, n: int, rounds: int, concurrency: int, floor_url: str,
                   processes: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """`drain`, round by round in turns with its floors: the gRPC floor it is held to
    (bench/grpc_floor.py, `concurrency` in flight as the worker keeps) and the raw-SQL drain
    (bench/floor.py, in the database at `floor_url`). Measured minutes apart, at the start and the
    end of a run, their ratio measured the machine's drift as much as the code. Answers the three,
    each the median of its rounds (`drain`, `grpc_floor`, `sql_floor`), the first two with the CPU
    each side's processes spent per task (bench/cpu.py): the drain's `processes` (by name: the
    dispatcher, the workers), PostgreSQL and this process (the rounds' enqueue and counting), the
    floor's server and client (this process)."""
    from bench import floor, grpc_floor

    rates: dict[str, list[float]] = {"drain": [], "grpc_floor": [], "sql_floor": []}
    spent: dict[str, list[dict[str, float]]] = {"drain": [], "grpc_floor": []}
    drain_cpu = cpu.sampler({**(processes or {}), "benchmark": [os.getpid()]},
                            postgres=cpu.postmaster(database_url))
    with (psycopg.connect(database_url, autocommit=True) as conn, grpc_floor.server() as (addr, server_pid),
          psycopg.connect(floor_url, autocommit=True) as floor_conn):
        floor_cpu = cpu.sampler({"server": [server_pid], "client": [os.getpid()]})
        for r in range(rounds):
            rates["drain"].append(drain_round(conn, n=n, desc=f"drain {r + 1}/{rounds}", sample=drain_cpu,
                                              spent=spent["drain"]))
            before = floor_cpu()
            rates["grpc_floor"].append(grpc_floor.round_rate(addr, n=n, concurrency=concurrency))
            spent["grpc_floor"].append(cpu.per_task(before, floor_cpu(), n))
            rates["sql_floor"].append(floor.drain_round(floor_conn, floor_url, n=n,
                                                        desc=f"raw SQL floor {r + 1}/{rounds}"))
    return {"drain": {**rounds_summary(rates["drain"], n=n), "cpu_us_per_task": cpu.medians(spent["drain"])},
            "grpc_floor": {**rounds_summary(rates["grpc_floor"], n=n, concurrency=concurrency),
                           "cpu_us_per_task": cpu.medians(spent["grpc_floor"])},
            "sql_floor": rounds_summary(rates["sql_floor"], n=n, connections=floor.DRAIN_CONNECTIONS)}


def controlled(database_url: str, *, n: int, rounds: int, slots: int,
               processes: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """The drain on a queue whose max_running is the workers' `slots`, and on one whose tasks have
    KEYS keys under max_running_per_key (twice a fair share of the slots, so the claim's turns
    are measured, not the limit). The workers serve both queues: their hellos made the rows.

    Beside them, the capped drain's bound: HELD_QUEUE, which the dispatcher runs with no limit but
    frees a slot only once the task's end is written, the constraint that max_running at the
    workers' slots puts on any claim (its tasks DISPATCHING or RUNNING in the database never more
    than the slots), with nothing counted. The capped drain's ratio to it is the cost of the
    limit's own work; its ratio to the unlimited drain, what the constraint leaves.

    The rounds take turns with the unlimited drain (unlimited, capped, keyed, bound, then again), and
    each is compared with the unlimited rounds beside it: the machine's speed drifts over the
    minutes between separate runs, and a ratio of figures taken apart would measure the drift.
    Each side also answers the CPU its `processes`, PostgreSQL and this process spent per task
    (as `drain_in_turns`): a ratio under 1 is extra work per task or idle cores, and this tells which."""
    from tasks.services import queue_update

    per_key = max(1, -(-2 * slots // KEYS))
    queue_update(name=CAPPED_QUEUE, data={"max_running": slots})
    queue_update(name=KEYED_QUEUE, data={"max_running_per_key": per_key})
    sides: dict[str, tuple[str, int, str]] = {
        "unlimited": (DRAIN_QUEUE, 0, "drain, in turns with the controls"),
        "max_running": (CAPPED_QUEUE, 0, f"drain, max_running {slots}"),
        "keys": (KEYED_QUEUE, KEYS, f"drain, {KEYS} keys"),
        "held": (HELD_QUEUE, 0, "drain, slots freed once ends are written"),
    }
    rates: dict[str, list[float]] = {side: [] for side in sides}
    spent: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    sample = cpu.sampler({**(processes or {}), "benchmark": [os.getpid()]}, postgres=cpu.postmaster(database_url))
    with psycopg.connect(database_url, autocommit=True) as conn:
        for r in range(rounds):
            for side, (queue, keys, label) in sides.items():
                rates[side].append(drain_round(conn, n=n, queue=queue, keys=keys, desc=f"{label} {r + 1}/{rounds}",
                                               sample=sample, spent=spent[side]))
    out = {side: {**rounds_summary(rates[side], n=n), "min_per_s": min(rates[side]),
                  "max_per_s": max(rates[side]), "cpu_us_per_task": cpu.medians(spent[side])} for side in sides}
    out["max_running"]["max_running"] = slots
    out["keys"].update(keys=KEYS, max_running_per_key=per_key)
    for side in ("max_running", "keys", "held"):
        out[side]["ratio"] = out[side]["rate_per_s"] / out["unlimited"]["rate_per_s"]
    out["max_running"]["ratio_to_held"] = out["max_running"]["rate_per_s"] / out["held"]["rate_per_s"]
    return out


# A new task's way from `valka.enqueue` to its handler, hop by hop: (name, from, to), the moments
# as `hops` puts them together from the benchmark's clock, the dispatcher's hop log and the handler.
HOPS = (("enqueue: call → return (INSERT, NOTIFY, commit)", "call", "returned"),
        ("return → NOTIFY read by the dispatcher", "returned", "notified"),
        ("NOTIFY → claim begins", "notified", "claim_began"),
        ("claim (CLAIM_IDS or CLAIM, one round trip)", "claim_began", "claim_ended"),
        ("claimed → its write to the stream done", "claim_ended", "sent"),
        ("write done → handler starts (gRPC, the SDK)", "sent", "started"))


def hops(hop_log: Path, samples: Moments) -> dict[str, Any]:
    """p50/p99 of each of HOPS over the tasks of `samples` that the dispatcher's hop log
    (dispatcher/hops.py) names."""
    moments = {str(task_id): {"call": call, "returned": returned, "started": started}
               for task_id, (call, returned, started) in samples.items()}
    for line in hop_log.read_text().splitlines() if hop_log.exists() else []:
        stamps = json.loads(line)
        known = moments.get(stamps.pop("task_id"))
        if known is not None:
            known.update(stamps)
    complete = [m for m in moments.values() if all(m.get(k) is not None for _, a, b in HOPS for k in (a, b))]
    out: dict[str, Any] = {"samples": len(complete)}
    for name, start, end in HOPS:
        ms = [(m[end] - m[start]) * 1000 for m in complete]
        out[name] = {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}
    return out


Moments = dict[Any, tuple[float, float, float]]  # task id → (enqueue called, it returned, handler started)


def stamps(database_url: str, *, count: int, rate: float, queue: str = LATENCY_QUEUE,
           label: str = "latency", beside: Callable[[], object] | None = None) -> Moments:
    """Enqueue `count` stamp tasks at `rate`/s through Django's default connection, which must
    reach `database_url`, and wait until they are done: each one's moments. `beside`, if given,
    is called half an interval after each enqueue."""
    from tasks.services import task_enqueue

    sent: dict[Any, tuple[float, float]] = {}

    def send(_: int) -> None:
        before = time.time()
        task = task_enqueue(task_name="stamp", queue=queue)
        sent[task.id] = (before, time.time())

    if beside is None:
        paced(count, rate, f"{label} ({rate:.0f}/s)", send)
    else:
        paced(2 * count, 2 * rate, f"{label} ({rate:.0f}/s, in turns)",
              lambda i: send(i) if i % 2 == 0 else beside())
    return moments_of(database_url, sent, label)


def moments_of(database_url: str, sent: dict[Any, tuple[float, float]], label: str) -> Moments:
    """Wait until the stamp tasks `sent` (id → when its enqueue was called and returned) are done
    in `database_url`: each one's moments, its handler's start read from its output."""
    ids = list(sent)
    with psycopg.connect(database_url, autocommit=True) as conn:
        def done() -> int:
            row = conn.execute("SELECT count(*) FROM tasks WHERE id = ANY(%s) AND status = 'COMPLETED'",
                               (ids,)).fetchone()
            return row[0] if row else 0

        wait_until_done(done, len(ids), f"{label} (finishing)", 60)
        rows = conn.execute("SELECT id, (output->>'started')::float8 FROM tasks WHERE id = ANY(%s)",
                            (ids,)).fetchall()
    return {task_id: (*sent[task_id], at) for task_id, at in rows}


def latency_figures(moments: Moments, rate: float) -> dict[str, Any]:
    """p50/p99 of start − return (and of start − call, under "from_call"), in ms."""
    return {**arrival_summary(moments), "rate": rate}


def latency(database_url: str, *, count: int, rate: float = 20.0, queue: str = LATENCY_QUEUE,
            label: str = "latency", hop_log: Path | None = None, floor_url: str | None = None) -> dict[str, Any]:
    """Enqueue `count` stamp tasks at `rate`/s with idle workers; p50/p99 of start − enqueue, and,
    given the dispatcher's hop log, where the time went.

    Given `floor_url`, two floors in that database take turns with the enqueues, half an interval
    after each, at the same pace and in the same moments: a bare INSERT + commit (bench/floor.py
    `commit_timer`), a durable commit's own p50/p99 (`commit_floor`), which the figures counted
    from the enqueue's call cannot beat; then a row and its NOTIFY relayed to a worker process
    over the worker stream (bench/latency_floor.py), the way to a handler with none of Valka's
    work on it (`delivery_floor`)."""
    from bench import floor, latency_floor

    floors: dict[str, Any] = {}
    if floor_url is None:
        moments = stamps(database_url, count=count, rate=rate, queue=queue, label=label)
    else:
        commits: list[float] = []
        with psycopg.connect(floor_url, autocommit=True) as conn:
            conn.execute(floor.SCHEMA)
            commit = floor.commit_timer(conn)
            with latency_floor.delivery(floor_url) as delivery:
                def beside() -> None:
                    commits.append(commit())
                    delivery.send()

                moments = stamps(database_url, count=count, rate=rate, queue=queue, label=label, beside=beside)
                floors = {"commit_floor": latency_summary(commits), "delivery_floor": delivery.figures()}
    out = {**latency_figures(moments, rate), **floors}
    if hop_log is not None:
        out["hops"] = hops(hop_log, moments)
    return out
