"""One table on stdout; the raw figures as JSON and a chart as PNG under bench/results/."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

# (label, unit, target, Valka's figure, the peers' figure, higher is better)
Row = tuple[str, str, str, Any, dict[str, Any], bool]


def _get(data: dict[str, Any] | None, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _spread(valka: dict[str, Any], path: tuple[str, ...], figure: str, low: str,
            high: str) -> tuple[Any, Any, Any] | None:
    """One side of a comparison in turns (`path` in Valka's figures): its figure and the two ends
    of its spread."""
    figures = _get(valka, *path)
    if not isinstance(figures, dict) or figures.get(figure) is None:
        return None
    return figures[figure], figures.get(low), figures.get(high)


def _ratio_of(valka: dict[str, Any], figure: tuple[str, ...], floor: tuple[str, ...]) -> float | None:
    """A rate of Valka's ÷ a floor's rate measured in the same run."""
    ours, bound = _get(valka, *figure, "rate_per_s"), _get(valka, *floor, "rate_per_s")
    return ours / bound if ours and bound else None


def rows(results: dict[str, Any]) -> list[Row]:
    v = results.get("valka", {})
    peers = results.get("peers", {})

    def peer(*path: str) -> dict[str, Any]:
        return {name: _get(figures, *path) for name, figures in peers.items()}

    none = dict.fromkeys(peers)
    out: list[Row] = [
        ("enqueue, in-process, 1 caller", "tasks/s", "", _get(v, "enqueue", "in_process_x1", "rate_per_s"),
         peer("enqueue_single", "rate_per_s"), True),
        ("  ÷ the INSERT + commit floor, 1 caller", "ratio", "≥ 0.70",
         _ratio_of(v, ("enqueue", "in_process_x1"), ("floor", "enqueue_single")), none, True),
        ("  ÷ the tasks table's bare INSERT + NOTIFY, 1 caller", "ratio", "",
         _ratio_of(v, ("enqueue", "in_process_x1"), ("floor", "enqueue_tasks_table")), none, True),
        # Celery's own figure above is measured apart, after Valka's run; this one in turns with Valka's.
        ("  ÷ Celery+Redis's, measured in turns with it", "ratio", "≥ 1.00",
         _ratio_of(v, ("enqueue", "in_process_x1"), ("enqueue", "celery_in_turns")), none, True),
        ("enqueue, in-process, 8 threads", "tasks/s", "", _get(v, "enqueue", "in_process_x8", "rate_per_s"),
         none, True),
        ("enqueue, REST single, 8 clients", "tasks/s", "", _get(v, "enqueue", "rest_x8", "rate_per_s"),
         none, True),
        ("  ÷ the INSERT + NOTIFY + commit floor, 8 callers", "ratio", "≥ 0.20",
         _ratio_of(v, ("enqueue", "rest_x8"), ("floor", "enqueue_x8_notify")), none, True),
        ("  ÷ the web floor (uvicorn + the same INSERT, no framework), 8 clients", "ratio", "",
         _ratio_of(v, ("enqueue", "rest_x8"), ("floor", "web_x8")), none, True),
        ("enqueue, REST batch of 1,000", "tasks/s", "", _get(v, "enqueue", "rest_batch", "rate_per_s"),
         peer("enqueue_batch", "rate_per_s"), True),
        ("enqueue, gRPC CreateTask, 8 callers", "tasks/s", "", _get(v, "enqueue", "grpc_x8", "rate_per_s"),
         none, True),
        ("enqueue in-process, no tracer provider", "µs/task", "", _get(v, "tracing", "enqueue", "off_us"), none,
         False),
        ("  with tracing on (spans recorded, not exported)", "µs/task", "", _get(v, "tracing", "enqueue", "on_us"),
         none, False),
        ("SDK worker's own work per task, no tracer provider", "µs/task", "",
         _get(v, "tracing", "worker", "off_us"), none, False),
        ("  with tracing on (spans recorded, not exported)", "µs/task", "", _get(v, "tracing", "worker", "on_us"),
         none, False),
        ("drain (no-op tasks)", "tasks/s", "", _get(v, "drain", "rate_per_s"),
         peer("drain", "rate_per_s"), True),
        ("  ÷ the gRPC floor, 1 worker", "ratio", "≥ 0.80", _ratio_of(v, ("drain",), ("grpc_floor",)), none, True),
        # Where each side's CPU goes, per task (bench/cpu.py): the ratio above is about the inverse of
        # the totals' ratio, both sides keeping the two cores busy.
        ("  CPU per task: dispatcher", "µs CPU", "", _get(v, "drain", "cpu_us_per_task", "dispatcher"), none,
         False),
        ("  CPU per task: worker", "µs CPU", "", _get(v, "drain", "cpu_us_per_task", "worker"), none, False),
        ("  CPU per task: PostgreSQL", "µs CPU", "", _get(v, "drain", "cpu_us_per_task", "postgres"), none,
         False),
        ("  CPU per task: all, the benchmark's counting too", "µs CPU", "",
         _get(v, "drain", "cpu_us_per_task", "total"), none, False),
        ("  the gRPC floor's CPU per task: server + client", "µs CPU", "",
         _get(v, "grpc_floor", "cpu_us_per_task", "total"), none, False),
        ("Django Task.enqueue(), in-process, 1 caller", "tasks/s", "", _get(v, "django", "enqueue_in_process",
         "rate_per_s"), peer("django_enqueue", "rate_per_s"), True),
        ("  ÷ valka.enqueue beside it", "ratio", "≥ 0.80", _get(v, "django", "enqueue_in_process", "ratio"),
         none, True),
        ("Django Task.enqueue(), REST, 1 caller", "tasks/s", "", _get(v, "django", "enqueue_remote", "rate_per_s"),
         none, True),
        ("  ÷ REST create beside it", "ratio", "≥ 0.80", _get(v, "django", "enqueue_remote", "ratio"), none, True),
        ("drain, Django @task no-ops, 1 valka_worker", "tasks/s", "≥ 5× django-tasks-db",
         _get(v, "django", "drain", "rate_per_s"), peer("django_drain", "rate_per_s"), True),
        # The queues with controls in turns with the unlimited drain (bench/drain.py controlled):
        # median (min–max of the rounds), and the ratio of the medians.
        ("drain, unlimited, in turns with the controls", "tasks/s", "",
         _spread(v, ("controls", "unlimited"), "rate_per_s", "min_per_s", "max_per_s"), none, True),
        ("drain, max_running = the workers' slots", "tasks/s", "",
         _spread(v, ("controls", "max_running"), "rate_per_s", "min_per_s", "max_per_s"), none, True),
        ("  ÷ the unlimited drain beside it", "ratio", "≥ 0.90", _get(v, "controls", "max_running", "ratio"),
         none, True),
        # Its bound: no limit, but slots freed only once the ends are written (bench/drain.py controlled).
        ("drain, slots freed once ends are written (bound)", "tasks/s", "",
         _spread(v, ("controls", "held"), "rate_per_s", "min_per_s", "max_per_s"), none, True),
        ("  ÷ the unlimited drain beside it", "ratio", "", _get(v, "controls", "held", "ratio"), none, True),
        ("  max_running ÷ this bound", "ratio", "", _get(v, "controls", "max_running", "ratio_to_held"),
         none, True),
        ("drain, 100 concurrency keys", "tasks/s", "",
         _spread(v, ("controls", "keys"), "rate_per_s", "min_per_s", "max_per_s"), none, True),
        ("  ÷ the unlimited drain beside it", "ratio", "≥ 0.80", _get(v, "controls", "keys", "ratio"), none, True),
        # Each side's CPU per task, all processes (bench/cpu.py; by process in the JSON): a ratio
        # under 1 with as much CPU per task is idle cores; with more, it is work.
        *((f"  CPU per task: all, {label}", "µs CPU", "", _get(v, "controls", side, "cpu_us_per_task", "total"),
           none, False)
          for side, label in (("unlimited", "unlimited"), ("max_running", "max_running"), ("keys", "100 keys"),
                              ("held", "bound"))),
        # One claim of a queue with max_running, as its running tasks grow (bench/limited_claim.py).
        ("limited claim of 64, none running", "ms", "", _get(v, "controls", "claim_cost", "none_running_ms"),
         none, False),
        (f"limited claim of 64, {_get(v, 'controls', 'claim_cost', 'running') or 10_000:,} running", "ms", "",
         _get(v, "controls", "claim_cost", "running_ms"), none, False),
        ("  ÷ none running", "ratio", "", _get(v, "controls", "claim_cost", "ratio"), none, False),
        ("idle-worker latency p50, from enqueue's return", "ms", "≤ Celery", _get(v, "latency", "p50_ms"),
         peer("latency", "p50_ms"), False),
        ("idle-worker latency p99, from enqueue's return", "ms", "≤ Celery", _get(v, "latency", "p99_ms"),
         peer("latency", "p99_ms"), False),
        ("idle-worker latency p50, from enqueue's call", "ms", "≤ Celery", _get(v, "latency", "from_call", "p50_ms"),
         peer("latency", "from_call", "p50_ms"), False),
        ("idle-worker latency p99, from enqueue's call", "ms", "≤ Celery", _get(v, "latency", "from_call", "p99_ms"),
         peer("latency", "from_call", "p99_ms"), False),
        # A bare INSERT + commit, paced in turns with those enqueues (bench/drain.py latency): the
        # durable commit alone, which the figures from the call include.
        ("  a bare INSERT + commit beside it, p50", "ms", "", _get(v, "latency", "commit_floor", "p50_ms"), none,
         False),
        ("  a bare INSERT + commit beside it, p99", "ms", "", _get(v, "latency", "commit_floor", "p99_ms"), none,
         False),
        # A row and its NOTIFY relayed to a worker process over the worker stream, in the same
        # turns (bench/latency_floor.py): the way to a handler with none of Valka's work on it.
        *((f"  the delivery floor beside it, {q}, from the {end}", "ms", "",
           _get(v, "latency", "delivery_floor", *path), none, False)
          for q, end, path in (("p50", "return", ("p50_ms",)), ("p99", "return", ("p99_ms",)),
                               ("p50", "call", ("from_call", "p50_ms")), ("p99", "call", ("from_call", "p99_ms")))),
        # The big table and the empty one in turns (bench/scale.py): median (min–max of the rounds),
        # and p99 (min–max of the chunks' p99).
        ("drain, empty table, in turns with the big one", "tasks/s", "",
         _spread(v, ("scale", "drain", "empty"), "rate_per_s", "min_per_s", "max_per_s"), none, True),
        ("drain, big table", "tasks/s", "within 10%",
         _spread(v, ("scale", "drain", "big"), "rate_per_s", "min_per_s", "max_per_s"), none, True),
        ("  big ÷ empty (medians)", "ratio", "≥ 0.90", _get(v, "scale", "drain", "ratio"), none, True),
        ("latency p50, empty table, in turns", "ms", "", _get(v, "scale", "latency", "empty", "p50_ms"), none,
         False),
        ("latency p50, big table", "ms", "within 10%", _get(v, "scale", "latency", "big", "p50_ms"), none, False),
        ("  big ÷ empty", "ratio", "≤ 1.10", _get(v, "scale", "latency", "ratio_p50"), none, False),
        ("latency p99, empty table, in turns", "ms", "",
         _spread(v, ("scale", "latency", "empty"), "p99_ms", "chunk_p99_min_ms", "chunk_p99_max_ms"), none, False),
        ("latency p99, big table", "ms", "within 10%",
         _spread(v, ("scale", "latency", "big"), "p99_ms", "chunk_p99_min_ms", "chunk_p99_max_ms"), none, False),
        ("  big ÷ empty", "ratio", "≤ 1.10", _get(v, "scale", "latency", "ratio_p99"), none, False),
        ("schedules: fire 10,000 due at one slot", "s", "< 5", _get(v, "schedules", "fire", "seconds"), none, False),
        ("drain, beside that firing", "tasks/s", "within noise",
         _get(v, "schedules", "fire", "drain_beside", "rate_per_s"), none, True),
        ("drain, just before it", "tasks/s", "", _get(v, "schedules", "fire", "drain_before", "rate_per_s"), none,
         True),
        ("drain, just after it", "tasks/s", "", _get(v, "schedules", "fire", "drain_after", "rate_per_s"), none,
         True),
        ("  beside ÷ the mean of before and after", "ratio", "≈ 1", _get(v, "schedules", "fire", "beside_ratio"),
         none, True),
        ("scheduler CPU, idle, 10,000 schedules", "%", "< 1", _get(v, "schedules", "idle", "cpu_percent"), none,
         False),
        ("raw-SQL floor: drain, 2 connections", "tasks/s", "", _get(v, "floor", "rate_per_s"), none, True),
        ("gRPC floor: worker stream round trips, 1 worker", "tasks/s", "", _get(v, "grpc_floor", "rate_per_s"),
         none, True),
        ("raw-SQL floor: INSERT + commit, 1 caller", "tasks/s", "", _get(v, "floor", "enqueue_single", "rate_per_s"),
         none, True),
        ("tasks table, bare psycopg: INSERT + NOTIFY + commit, 1 caller", "tasks/s", "",
         _get(v, "floor", "enqueue_tasks_table", "rate_per_s"), none, True),
        ("raw-SQL floor: INSERT + commit, 8 callers", "tasks/s", "", _get(v, "floor", "enqueue_x8", "rate_per_s"),
         none, True),
        ("raw-SQL floor: INSERT + NOTIFY + commit, 8 callers", "tasks/s", "",
         _get(v, "floor", "enqueue_x8_notify", "rate_per_s"), none, True),
        ("web floor: uvicorn + INSERT + NOTIFY + commit, 8 clients", "tasks/s", "",
         _get(v, "floor", "web_x8", "rate_per_s"), none, True),
        ("  ÷ the INSERT + NOTIFY + commit floor, 8 callers", "ratio", "",
         _ratio_of(v, ("floor", "web_x8"), ("floor", "enqueue_x8_notify")), none, True),
        ("dispatcher RSS, idle", "MiB", "", _get(v, "memory", "dispatcher_mib"), none, False),
        ("dispatcher RSS, 1,000 idle workers", "MiB", "", _get(v, "memory", "idle_workers", "dispatcher_rss_mib"),
         none, False),
        ("worker RSS (after drain)", "MiB", "", _get(v, "memory", "worker_mib"),
         peer("worker_rss_after_mib"), False),
    ]
    return [row for row in out if row[3] is not None]


def _fmt(value: Any, unit: str) -> str:
    if isinstance(value, tuple):  # a figure and its spread
        middle, low, high = value
        return f"{_fmt(middle, unit)} ({_fmt(low, unit)}–{_fmt(high, unit)})"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if unit == "ms":
        return f"{value:.1f}"
    if unit == "ms2":
        return f"{value:.2f}"
    if unit == "MiB":
        return f"{value:.0f}"
    if unit in ("ratio", "s", "%", "µs/task"):
        return f"{value:.2f}"
    return f"{value:,.0f}"


def _ratio(ours: Any, theirs: Any, higher_is_better: bool) -> str:
    if not ours or not theirs:
        return "—"
    return f"{ours / theirs if higher_is_better else theirs / ours:.1f}×"


def table(results: dict[str, Any]) -> str:
    """Markdown: Valka's figures, our performance targets, and each peer with Valka's advantage
    (its figure ÷ the peer's for rates, the peer's ÷ its own for times and memory: above 1× Valka leads)."""
    peers = list(results.get("peers", {}))
    head = ["workload", "unit", "target", "Valka"]
    for name in peers:
        head += [name, "Valka ×"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, unit, target, ours, theirs, higher in rows(results):
        cells = [label, unit, target, _fmt(ours, unit)]
        for name in peers:
            cells += [_fmt(theirs.get(name), unit), _ratio(ours, theirs.get(name), higher)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + hops_table(results))


def hops_table(results: dict[str, Any]) -> list[str]:
    """Where an idle-worker latency sample's time went, hop by hop (bench/drain.py HOPS): the
    latency workload's, then the big-table comparison's two sides, each side's p50 and p99."""
    lines = []
    hops = _get(results, "valka", "latency", "hops")
    if hops and hops.get("samples"):
        lines += ["", f"Idle-worker latency, hop by hop ({hops['samples']} tasks; p50 and p99 of each hop, ms):", "",
                  "| hop | p50 | p99 |", "|---|---|---|"]
        for name, figures in hops.items():
            if isinstance(figures, dict):
                lines.append(f"| {name} | {_fmt(figures['p50_ms'], 'ms2')} | {_fmt(figures['p99_ms'], 'ms2')} |")
    empty, big = (_get(results, "valka", "scale", "latency", side, "hops") for side in ("empty", "big"))
    if empty and big and empty.get("samples") and big.get("samples"):
        lines += ["", f"The big table's latency in turns with the empty one, hop by hop ({empty['samples']} and "
                  f"{big['samples']} tasks; p50 / p99 of each hop, ms):", "",
                  "| hop | empty table | big table |", "|---|---|---|"]
        for name, figures in empty.items():
            other = big.get(name)
            if isinstance(figures, dict) and isinstance(other, dict):
                lines.append(f"| {name} | {_fmt(figures['p50_ms'], 'ms2')} / {_fmt(figures['p99_ms'], 'ms2')} | "
                             f"{_fmt(other['p50_ms'], 'ms2')} / {_fmt(other['p99_ms'], 'ms2')} |")
    return lines


def write(results: dict[str, Any], name: str, folder: Path = RESULTS) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / f"{name}.json"
    raw.write_text(json.dumps(results, indent=1, default=str) + "\n")
    png = folder / f"{name}.png"
    chart(results, png)
    return raw, png


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = ["Valka", *results.get("peers", {})]
    figures = [results.get("valka", {}), *results.get("peers", {}).values()]
    panels = [
        ("Enqueue, 1 caller (tasks/s)", lambda f: _get(f, "enqueue", "in_process_x1", "rate_per_s")
         or _get(f, "enqueue_single", "rate_per_s")),
        ("Batch enqueue (tasks/s)", lambda f: _get(f, "enqueue", "rest_batch", "rate_per_s")
         or _get(f, "enqueue_batch", "rate_per_s")),
        ("Drain (tasks/s)", lambda f: _get(f, "drain", "rate_per_s")),
        ("Latency p50 / p99 (ms)", None),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.2), dpi=80)
    colours = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1"]
    for ax, (title, pick) in zip(axes, panels, strict=True):
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
        if pick is None:
            for i, f in enumerate(figures):
                p50, p99 = _get(f, "latency", "p50_ms"), _get(f, "latency", "p99_ms")
                if p50 is not None:
                    ax.bar([i - 0.2, i + 0.2], [p50, p99], width=0.38, color=colours[i % 4], alpha=0.9)
            ax.set_xticks(range(len(systems)), systems)
            continue
        values = [pick(f) or 0 for f in figures]
        ax.bar(range(len(systems)), values, color=colours[: len(systems)])
        ax.set_xticks(range(len(systems)), systems)
    fig.suptitle("Valka benchmark (2 cores, PostgreSQL with fsync on)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
