"""The benchmark run: one private durable PostgreSQL, Valka's stack, the workloads, the report.

Sizes come from arguments or BENCH_* environment variables (see `options()`); the
defaults finish in under ten minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench import report
from bench.interrupt import run_to_end, stop_on_sigterm
from bench.stack import ROOT, BenchStack, cluster, create_database, listening, wait_for

PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"


def options(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--n", type=int, default=int(env("BENCH_N", 10_000)), help="tasks per drain round")
    p.add_argument("--workers", type=int, default=int(env("BENCH_WORKERS", 1)), help="worker processes (W)")
    p.add_argument("--concurrency", type=int, default=int(env("BENCH_CONCURRENCY", 256)),
                   help="tasks in flight per worker process (C)")
    p.add_argument("--rounds", type=int, default=int(env("BENCH_ROUNDS", 3)), help="drain rounds (median)")
    p.add_argument("--enqueue-count", type=int, default=int(env("BENCH_ENQUEUE_COUNT", 2000)))
    p.add_argument("--batches", type=int, default=int(env("BENCH_BATCHES", 20)), help="REST batches of 1,000")
    p.add_argument("--latency-count", type=int, default=int(env("BENCH_LATENCY_COUNT", 1000)))
    p.add_argument("--latency-rate", type=float, default=float(env("BENCH_LATENCY_RATE", 20)))
    p.add_argument("--web-processes", type=int, default=int(env("BENCH_WEB_PROCESSES", 2)))
    p.add_argument("--finished", type=int, default=int(env("BENCH_SCALE_FINISHED", 1_000_000)))
    p.add_argument("--future", type=int, default=int(env("BENCH_SCALE_FUTURE", 100_000)))
    p.add_argument("--scale-rounds", type=int, default=int(env("BENCH_SCALE_ROUNDS", 5)),
                   help="drain rounds on each side of the big-table comparison, the sides taking turns")
    p.add_argument("--idle-workers", type=int, default=int(env("BENCH_IDLE_WORKERS", 1000)))
    p.add_argument("--django-concurrency", type=int, default=int(env("BENCH_DJANGO_CONCURRENCY", 64)),
                   help="tasks in flight in the valka_worker of the Django drain")
    p.add_argument("--schedules", type=int, default=int(env("BENCH_SCHEDULES", 10_000)),
                   help="schedules fired in one minute, and idle")
    p.add_argument("--schedule-idle-seconds", type=float, default=float(env("BENCH_SCHEDULE_IDLE_SECONDS", 60)))
    p.add_argument("--skip", default=env("BENCH_SKIP", ""),
                   help="comma-separated: enqueue,tracing,drain,controls,django,latency,floor,scale,schedules,memory")
    p.add_argument("--peers", action="store_true", help="also run Celery+Redis, Procrastinate and django-tasks-db")
    p.add_argument("--celery-concurrency", type=int, default=int(env("BENCH_CELERY_CONCURRENCY", 2)))
    p.add_argument("--procrastinate-concurrency", type=int, default=int(env("BENCH_PROCRASTINATE_CONCURRENCY", 8)))
    p.add_argument("--name", default=None, help="results file name (default: valka, or peers with --peers)")
    return p.parse_args(argv)


def setup_django(database_url: str) -> None:
    os.environ.update(DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="valka.settings",
                      VALKA_LOG_LEVEL="WARNING")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def run_valka(opts: argparse.Namespace, stack: BenchStack, redis_url: str | None = None) -> dict[str, Any]:
    """Valka's workloads on `stack`; with `redis_url` (bench-peers), Celery's single-caller enqueue
    takes turns with Valka's."""
    from bench import django_tasks, drain, enqueue, floor, grpc_floor, limited_claim, memory, scale, schedules, tracing
    from tasks.api.auth import api_key_create

    skip = set(filter(None, opts.skip.split(",")))
    out: dict[str, Any] = {"config": {"workers": opts.workers, "concurrency": opts.concurrency, "n": opts.n,
                                      "rounds": opts.rounds, "scale_rounds": opts.scale_rounds,
                                      "web_processes": opts.web_processes}}
    url = stack.database_url
    hop_log = stack.workdir / "hops.jsonl"  # the dispatcher's per-task timestamps (dispatcher/hops.py)
    # Its ApiService as deployed, as the web app's API below: callers must present a key.
    dispatcher, addr = stack.dispatcher(VALKA_DISPATCH_HOP_LOG=str(hop_log), VALKA_API_ANONYMOUS="false",
                                        VALKA_DISPATCH_HELD_QUEUES=drain.HELD_QUEUE)
    queues = [drain.DRAIN_QUEUE, drain.LATENCY_QUEUE, drain.CAPPED_QUEUE, drain.KEYED_QUEUE, drain.HELD_QUEUE]
    workers = stack.workers(addr, count=opts.workers, concurrency=opts.concurrency, queues=queues)
    out["memory"] = {"dispatcher_idle_start_mib": memory.rss({"d": dispatcher})["d"],
                     "worker_idle_start_mib": memory.rss({"w": workers[0]})["w"]}
    web = None
    sql_floor: dict[str, Any] | None = None  # the raw-SQL drain, measured in turns with the drain
    if "enqueue" not in skip:
        # The API as deployed: callers must present a key, which the web app looks up before it
        # reads a body (valka/asgi.py); the rest of the stack stays open, a local measurement.
        _, web = stack.web(processes=opts.web_processes, VALKA_API_ANONYMOUS="false")
        key = api_key_create(name="bench")[1]
        # The single caller in turns with the floors it is held to, which the floor section then
        # does not measure again.
        floor_url = create_database(url, "floor")
        # With the peers, Celery's enqueue takes its turn too: apart, minutes later, it met another machine.
        peers = {"celery": partial(celery_enqueue, redis_url)} if redis_url else None
        beside = enqueue.in_process_in_turns(opts.enqueue_count, floor_url=floor_url, database_url=url, peers=peers)
        web_floor, web_floor_url = stack.web(processes=opts.web_processes, app="bench.web_floor:app",
                                             BENCH_FLOOR_URL=floor_url)
        rest = enqueue.rest_single_in_turns(web, key, opts.enqueue_count, floor_url=floor_url,
                                            web_floor_url=web_floor_url)
        stack.stop(web_floor)
        out["floor"] = {"enqueue_single": beside["floor"], "enqueue_tasks_table": beside["tasks_table"],
                        "enqueue_x8": rest["enqueue_x8"], "enqueue_x8_notify": rest["enqueue_x8_notify"],
                        "web_x8": rest["web_x8"]}
        out["enqueue"] = {
            "in_process_x1": beside["valka"],
            **({"celery_in_turns": beside["celery"]} if redis_url else {}),
            "in_process_x8": enqueue.in_process(opts.enqueue_count * 2, threads=8),
            "rest_x8": rest["rest_x8"],
            "rest_batch": enqueue.rest_batch(web, key, opts.batches),
            "grpc_x8": enqueue.grpc_single(addr, key, opts.enqueue_count),
        }
        if "django" not in skip:
            out["django"] = {"enqueue_in_process": django_tasks.enqueue_in_process(opts.enqueue_count),
                             "enqueue_remote": django_tasks.enqueue_remote(web, key, opts.enqueue_count)}
        enqueue.cleanup(url)
    if "tracing" not in skip:
        out["tracing"] = {"enqueue": tracing.enqueue(opts.enqueue_count // 4), "worker": tracing.worker(opts.n // 10),
                          "checks_ns": tracing.checks()}
        tracing.cleanup(url)
    if "drain" not in skip:
        # In turns with its floors, which the floor section then does not measure again.
        in_turns = drain.drain_in_turns(url, n=opts.n, rounds=opts.rounds, concurrency=opts.concurrency,
                                        floor_url=create_database(url, "floor"),
                                        processes={"dispatcher": [dispatcher.pid],
                                                   "worker": [w.pid for w in workers]})
        sql_floor = in_turns.pop("sql_floor")
        out.update(in_turns)
        out["memory"]["worker_mib"] = memory.rss({"w": workers[0]})["w"]
    if "controls" not in skip:
        out["controls"] = drain.controlled(url, n=opts.n, rounds=opts.rounds, slots=opts.workers * opts.concurrency,
                                           processes={"dispatcher": [dispatcher.pid],
                                                      "worker": [w.pid for w in workers]})
        out["controls"]["claim_cost"] = limited_claim.measure(url)
    if "django" not in skip:
        worker = stack.django_worker(addr, web or "http://127.0.0.1:8989", concurrency=opts.django_concurrency,
                                     queue=django_tasks.DRAIN_QUEUE)
        out.setdefault("django", {})["drain"] = drain.drain(
            url, n=opts.n, rounds=opts.rounds, queue=django_tasks.DRAIN_QUEUE, task_name=django_tasks.NOOP,
            label="drain, Django @task")
        out["django"]["worker_mib"] = memory.rss({"w": worker})["w"]
        stack.stop(worker)
    if "latency" not in skip:
        out["latency"] = drain.latency(url, count=opts.latency_count, rate=opts.latency_rate, hop_log=hop_log,
                                       floor_url=create_database(url, "floor"))
    out["memory"]["dispatcher_mib"] = memory.rss({"d": dispatcher})["d"]
    # The big table in a database of its own, its rounds taking turns with the same workloads
    # on this one (bench/scale.py): the machine's speed drifts over minutes.
    if "scale" not in skip:
        print("seeding the big table ...", file=sys.stderr, flush=True)
        with scale.big_database(url, stack.workdir / "big", finished=opts.finished, future=opts.future,
                                workers=opts.workers, concurrency=opts.concurrency, queues=queues) as (big, seeded):
            hop_logs = {"empty": hop_log, "big": stack.workdir / "big" / scale.HOP_LOG}
            out["scale"] = {"seed": seeded, **scale.alternate(url, big, n=opts.n, rounds=opts.scale_rounds,
                                                              hop_logs=hop_logs,
                                                              latency_count=opts.latency_count,
                                                              latency_rate=opts.latency_rate)}
    if "schedules" not in skip:
        out["schedules"] = {"fire": schedules.fire(stack, count=opts.schedules, drain_n=opts.n),
                            "idle": schedules.idle(stack, count=opts.schedules, seconds=opts.schedule_idle_seconds)}
    if "floor" not in skip:
        floor_url = create_database(url, "floor")
        beside = out.get("floor") or {
            "enqueue_single": floor.enqueue_single(floor_url, opts.enqueue_count),
            "enqueue_tasks_table": floor.enqueue_tasks_table(url, opts.enqueue_count),
            "enqueue_x8": floor.enqueue_concurrent(floor_url, notify=False),
            "enqueue_x8_notify": floor.enqueue_concurrent(floor_url, notify=True)}
        out["floor"] = {**(sql_floor or floor.drain(floor_url, n=opts.n, rounds=opts.rounds)), **beside}
        if "grpc_floor" not in out:
            out["grpc_floor"] = grpc_floor.drain(n=opts.n, rounds=opts.rounds, concurrency=opts.concurrency)
    if "memory" not in skip:
        out["memory"]["idle_workers"] = memory.many_workers(stack, dispatcher, addr, opts.idle_workers)
    return out


@contextmanager
def redis_server(workdir: Path):
    """Debian's redis-server on a private loopback port, with its default persistence off."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("make bench-peers needs redis-server (apt-get install redis-server)")
    from valka.devdb import free_port

    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: listening(port), 20, "redis-server")
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _peers_env() -> dict[str, str]:
    """The environment of a peer's process: none of Valka's settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "VALKA_")) and k != "DATABASE_URL"}


def celery_enqueue(redis_url: str, count: int) -> float:
    """One round of Celery's single-caller enqueue (tasks/s), in a process of the peers' virtualenv."""
    proc = run_to_end([str(PEERS_PYTHON), "-m", "bench.peers.run", "celery-enqueue", "--redis-url", redis_url,
                       "--enqueue-count", str(count)], cwd=ROOT, env=_peers_env())
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["rate_per_s"])


def run_peers(opts: argparse.Namespace, database_url: str, redis_url: str) -> dict[str, Any]:
    common = ["--n", str(opts.n), "--rounds", str(opts.rounds), "--enqueue-count", str(opts.enqueue_count),
              "--batches", str(opts.batches), "--latency-count", str(opts.latency_count),
              "--latency-rate", str(opts.latency_rate), "--celery-concurrency", str(opts.celery_concurrency),
              "--procrastinate-concurrency", str(opts.procrastinate_concurrency)]
    out = {}
    for peer, extra in (("celery", ["--redis-url", redis_url]),
                        ("procrastinate", ["--procrastinate-url", create_database(database_url, "procrastinate")]),
                        ("django-tasks-db", ["--django-tasks-db-url", create_database(database_url,
                                                                                       "django_tasks_db")])):
        proc = run_to_end([str(PEERS_PYTHON), "-m", "bench.peers.run", peer, *common, *extra], cwd=ROOT,
                          env=_peers_env())
        out[peer] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def machine() -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "commit": commit.stdout.strip(),
            "cores": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "load_average_at_start": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    stop_on_sigterm()
    opts = options(argv)
    began = time.monotonic()
    results: dict[str, Any] = {"machine": machine()}
    if opts.peers and not PEERS_PYTHON.exists():
        raise SystemExit("the peers' virtualenv is missing: run `make bench-peers`")
    with ExitStack() as running:
        workdir = Path(running.enter_context(tempfile.TemporaryDirectory(prefix="valka-bench-")))
        pg = running.enter_context(cluster(durable=True))
        redis_url = running.enter_context(redis_server(workdir)) if opts.peers else None
        results["machine"]["postgres"] = "fsync on, synchronous_commit on (devdb.Cluster durable)"
        setup_django(pg.url)
        stack = BenchStack(pg.url, workdir)
        try:
            results["valka"] = run_valka(opts, stack, redis_url)
        except BaseException:
            stack.print_logs()
            raise
        finally:
            stack.stop_all()
        if redis_url:
            results["peers"] = run_peers(opts, pg.url, redis_url)
    results["machine"]["seconds"] = round(time.monotonic() - began)
    raw, png = report.write(results, opts.name or ("peers" if opts.peers else "valka"))
    print(report.table(results))
    print(f"\n{results['machine']['cores']} cores ({results['machine']['cpu']}), "
          f"{results['machine']['seconds']} s; raw figures: {raw.relative_to(ROOT)}, chart: {png.relative_to(ROOT)}")
    return 0
