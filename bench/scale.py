"""The big table, and the drain and latency on it beside an almost empty one.

The big table: a million finished tasks and a hundred thousand scheduled for later, in the
very queues the drain and latency workloads use, written with generate_series (`seed`).

The machine's speed drifts by up to 2× from one minute to the next, so a block of rounds on
the empty table and then a block on the big one cannot tell the table's cost from the drift.
So the big table has a database of its own on the same server, served by a dispatcher and
workers of its own (`big_database`), the main database being the empty side, and the two
sides take turns (`alternate`): a drain round on each, round after round, then the latency, the
sides' enqueues taking turns one by one (`stamps_in_turns`). Each side's figures come with their
spread, and big ÷ empty says what the table costs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench import drain
from bench.measure import paced, rounds_summary
from bench.stack import BenchStack, create_database, django_database, django_databases, drop_database

SIDES = ("empty", "big")


def turns(count: int) -> list[str]:
    """`count` turns of each side, in ABBA order (empty, big, big, empty, ...): a drift that
    goes one way through the block weighs on both sides alike."""
    return [side for i in range(count) for side in (SIDES if i % 2 == 0 else SIDES[::-1])]
CHUNKS = 4  # latency chunks per side
HOP_LOG = "hops.jsonl"  # the big side's dispatcher hop log, in its work folder
# Not counted, on each side before the turns: the big side's processes are new, where the empty
# side's have run the workloads before.
WARM_UP_DRAIN = 1000
WARM_UP_LATENCY = 5

# Finished tasks in the past (spread over a week) and PENDING ones due tomorrow or later.
# session_replication_role = replica skips the tasks triggers (events and counters) for this
# seed only: its million NOTIFY payloads would measure the seed, not the queue.
SEED_FINISHED = """
INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count, timeout_seconds,
                   input, metadata, output, run_at, created_at, updated_at, started_at, finished_at)
SELECT gen_random_uuid(), 'noop', (%(queues)s::text[])[1 + g %% cardinality(%(queues)s::text[])],
       'COMPLETED', 0, 3, 1, 300,
       jsonb_build_object('n', g), '{}', NULL, t, t, t + interval '2 ms', t + interval '1 ms', t + interval '2 ms'
FROM generate_series(1, %(count)s) g,
     LATERAL (SELECT now() - interval '8 days' + g * (interval '7 days' / %(count)s)) AS at(t)
"""
SEED_FUTURE = """
INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count, timeout_seconds,
                   input, metadata, run_at, created_at, updated_at)
SELECT gen_random_uuid(), 'noop', (%(queues)s::text[])[1 + g %% cardinality(%(queues)s::text[])],
       'PENDING', 0, 3, 0, 300,
       jsonb_build_object('n', g), '{}', now() + interval '1 day' + g * interval '1 s', now(), now()
FROM generate_series(1, %(count)s) g
"""


def seed(database_url: str, *, finished: int, future: int, queues: list[str]) -> dict[str, Any]:
    start = time.perf_counter()
    with psycopg.connect(database_url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(SEED_FINISHED, {"queues": queues, "count": finished})
            conn.execute(SEED_FUTURE, {"queues": queues, "count": future})
        conn.execute("VACUUM ANALYZE tasks")
        # The seed writes about a gigabyte of WAL in seconds, where a real table grows over days.
        # Left to itself, the checkpoint it sets off runs during the measured drain (writing the
        # seed's pages, and a full-page image of each page first changed after it began): 10%
        # of the drain's rate, the seed's cost rather than the big table's.
        conn.execute("CHECKPOINT")
        rows = conn.execute("SELECT count(*) FROM tasks").fetchone()
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('tasks'))").fetchone()
    return {"finished": finished, "future": future, "rows": rows[0] if rows else 0,
            "table_size": size[0] if size else "", "seconds": time.perf_counter() - start}


@contextlib.contextmanager
def big_database(url: str, workdir: Path, *, finished: int, future: int, workers: int, concurrency: int,
                 queues: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A second database on `url`'s server, migrated and seeded (`seed`), with a dispatcher and
    `workers` worker processes of its own serving `queues`; yields its URL and the seed's figures.
    Afterwards its processes are stopped and the database dropped."""
    name = conninfo_to_dict(url)["dbname"] + "_big"
    drop_database(url, name)  # what a killed run left
    big_url = create_database(url, name)
    workdir.mkdir(parents=True, exist_ok=True)
    stack = BenchStack(big_url, workdir)
    try:
        stack.migrate()
        seeded = seed(big_url, finished=finished, future=future, queues=[drain.DRAIN_QUEUE, drain.LATENCY_QUEUE])
        # A hop log, as the main dispatcher has: it costs a line per task sent.
        _, addr = stack.dispatcher(VALKA_DISPATCH_HOP_LOG=str(workdir / HOP_LOG))
        stack.workers(addr, count=workers, concurrency=concurrency, queues=queues, prefix="big")
        yield big_url, seeded
    except BaseException:
        stack.print_logs()
        raise
    finally:
        stack.stop_all()
        drop_database(url, name)


def alternate(empty_url: str, big_url: str, *, n: int, rounds: int, latency_count: int, latency_rate: float,
              chunks: int = CHUNKS, hop_logs: dict[str, Path] | None = None) -> dict[str, Any]:
    """Drain and latency on both sides in turns (`turns`): `rounds` drain rounds of n tasks
    each, then `latency_count` latency samples each, one side's after the other's, their p99's
    spread taken over `chunks` consecutive parts; given each side's dispatcher hop log
    (`hop_logs`, by side), where each side's latency went, hop by hop.

    The side resting meanwhile keeps its processes, idle. Each turn points Django's default
    connection (the enqueue, the counters) at its side's database."""
    urls = dict(zip(SIDES, (empty_url, big_url), strict=True))
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    with contextlib.ExitStack() as open_conns:
        conns = {side: open_conns.enter_context(psycopg.connect(url, autocommit=True)) for side, url in urls.items()}
        for side in SIDES:
            with django_database(urls[side]):
                drain.drain_round(conns[side], n=min(n, WARM_UP_DRAIN), desc=f"warm-up, {side} table")
                drain.stamps(urls[side], count=min(latency_count, WARM_UP_LATENCY), rate=latency_rate,
                             label=f"warm-up, {side} table")
        for side in turns(rounds):
            with django_database(urls[side]):
                rates[side].append(drain.drain_round(
                    conns[side], n=n, desc=f"drain, {side} table {len(rates[side]) + 1}/{rounds}"))
    moments = stamps_in_turns(urls, count=latency_count, rate=latency_rate)
    samples = {side: _chunks(moments[side], chunks) for side in SIDES}
    latency = _latency_figures(samples, latency_rate)
    for side, hop_log in (hop_logs or {}).items():
        latency[side]["hops"] = drain.hops(hop_log, moments[side])
    return {"drain": _drain_figures(rates, n), "latency": latency}


def stamps_in_turns(urls: dict[str, str], *, count: int, rate: float) -> dict[str, drain.Moments]:
    """`count` stamp tasks on each side, the sides' enqueues taking turns one by one (`turns`), each
    side at `rate` per second: whatever the machine meets meanwhile (a checkpoint, an autovacuum,
    a drift of its speed) falls on both sides alike, where chunks of a side's samples took it
    alone. Each side's moments, in the order they were sent."""
    from tasks.services import task_enqueue

    order = turns(count)
    sent: dict[str, dict[Any, tuple[float, float]]] = {side: {} for side in SIDES}
    with django_databases(urls) as use:
        def send(i: int) -> None:
            side = order[i]
            use(side)
            before = time.time()
            task = task_enqueue(task_name="stamp", queue=drain.LATENCY_QUEUE)
            sent[side][task.id] = (before, time.time())

        paced(len(order), rate * len(SIDES), f"latency, both tables in turns ({rate:.0f}/s each)", send)
    found = {side: drain.moments_of(urls[side], sent[side], f"latency, {side} table") for side in SIDES}
    return {side: {task_id: found[side][task_id] for task_id in sent[side] if task_id in found[side]}
            for side in SIDES}


def _chunks(moments: drain.Moments, chunks: int) -> list[drain.Moments]:
    """`moments` in `chunks` consecutive parts, as even as they go: the spread of their p99s."""
    items = list(moments.items())
    each, extra = divmod(len(items), chunks)
    out, at = [], 0
    for i in range(chunks):
        size = each + (i < extra)
        if size:
            out.append(dict(items[at:at + size]))
            at += size
    return out


def _drain_figures(rates: dict[str, list[float]], n: int) -> dict[str, Any]:
    """Each side's median and spread of its rounds' rates; big ÷ empty of the medians."""
    out: dict[str, Any] = {side: {**rounds_summary(values, n=n), "min_per_s": min(values),
                                  "max_per_s": max(values)} for side, values in rates.items()}
    out["ratio"] = out["big"]["rate_per_s"] / out["empty"]["rate_per_s"]
    return out


def _latency_figures(samples: dict[str, list[drain.Moments]], rate: float) -> dict[str, Any]:
    """Each side's percentiles over all its samples, and the spread of its chunks' p99; big ÷
    empty of the p50 and of the p99."""
    out: dict[str, Any] = {}
    for side, chunks in samples.items():
        chunk_p99 = [drain.latency_figures(chunk, rate)["p99_ms"] for chunk in chunks]
        out[side] = {**drain.latency_figures({k: v for chunk in chunks for k, v in chunk.items()}, rate),
                     "chunk_p99_ms": chunk_p99, "chunk_p99_min_ms": min(chunk_p99, default=None),
                     "chunk_p99_max_ms": max(chunk_p99, default=None)}
    for p in ("p50", "p99"):
        out[f"ratio_{p}"] = out["big"][f"{p}_ms"] / out["empty"][f"{p}_ms"]
    out["chunks"] = len(samples["empty"])
    return out
