"""The benchmark harness works (tiny sizes, no timing asserted): `make bench` itself is not part of the suite."""

import contextlib
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from bench import drain, limited_claim, measure, report
from bench.interrupt import run_to_end
from bench.stack import ROOT, BenchStack
from tasks.models import Task
from tests.helpers import database_url


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(measure, "PROGRESS", False)


@contextlib.contextmanager
def floor_table():
    """For a block that makes the floors' bare table (bench/floor.py) in the test database: drop it after."""
    try:
        yield
    finally:
        with psycopg.connect(database_url(), autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS floor_jobs")


def floor_rows(queue: str) -> int:
    with psycopg.connect(database_url(), autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM floor_jobs WHERE queue = %s", (queue,)).fetchone()[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_drain_and_latency_on_a_real_stack(tmp_path, quiet):
    stack = BenchStack(database_url(), tmp_path)
    try:
        hop_log = tmp_path / "hops.jsonl"
        dispatcher, addr = stack.dispatcher(VALKA_DISPATCH_HOP_LOG=str(hop_log),
                                            VALKA_DISPATCH_HELD_QUEUES=drain.HELD_QUEUE)
        workers = stack.workers(addr, count=1, concurrency=8,
                                queues=[drain.DRAIN_QUEUE, drain.LATENCY_QUEUE, drain.CAPPED_QUEUE, drain.KEYED_QUEUE,
                                        drain.HELD_QUEUE])
        with floor_table():  # the raw-SQL floor in turns too
            beside = drain.drain_in_turns(database_url(), n=50, rounds=2, concurrency=8, floor_url=database_url(),
                                          processes={"dispatcher": [dispatcher.pid],
                                                     "worker": [w.pid for w in workers]})
            assert floor_rows("floor") == 50
        drained, grpc_floor, sql_floor = beside["drain"], beside["grpc_floor"], beside.pop("sql_floor")
        assert drained["n"] == 50 and len(drained["rounds"]) == 2 and drained["rate_per_s"] > 0
        assert grpc_floor["concurrency"] == 8 and len(grpc_floor["rounds"]) == 2 and grpc_floor["rate_per_s"] > 0
        assert sql_floor["connections"] == 2 and len(sql_floor["rounds"]) == 2 and sql_floor["rate_per_s"] > 0
        # The CPU by process, per task (a few clock ticks at these sizes: their sum is what is checked).
        spent = drained["cpu_us_per_task"]
        assert set(spent) == {"dispatcher", "worker", "postgres", "benchmark", "total"}
        assert spent["total"] > 0 and min(spent.values()) >= 0
        # The floor's two processes spend under one clock tick on some rounds of 50: zero is a reading.
        assert set(grpc_floor["cpu_us_per_task"]) == {"server", "client", "total"}
        assert min(grpc_floor["cpu_us_per_task"].values()) >= 0
        ratio = drained["rate_per_s"] / grpc_floor["rate_per_s"]
        assert f"|   ÷ the gRPC floor, 1 worker | ratio | ≥ 0.80 | {ratio:.2f} |" in report.table({"valka": beside})
        controlled = drain.controlled(database_url(), n=30, rounds=1, slots=8,
                                      processes={"dispatcher": [dispatcher.pid], "worker": [w.pid for w in workers]})
        assert controlled["max_running"]["n"] == 30 and controlled["max_running"]["max_running"] == 8
        assert controlled["keys"]["n"] == 30 and controlled["keys"]["max_running_per_key"] == 1
        assert controlled["held"]["n"] == 30
        # Each has its unlimited drain beside it, and is compared with that.
        unlimited = controlled["unlimited"]
        assert unlimited["n"] == 30 and unlimited["min_per_s"] <= unlimited["rate_per_s"] <= unlimited["max_per_s"]
        for side in ("max_running", "keys", "held"):
            assert controlled[side]["ratio"] == controlled[side]["rate_per_s"] / unlimited["rate_per_s"]
        # The capped drain is also held to its bound, the drain whose slots free once ends are written.
        capped_to_bound = controlled["max_running"]["rate_per_s"] / controlled["held"]["rate_per_s"]
        assert controlled["max_running"]["ratio_to_held"] == capped_to_bound
        for side in ("unlimited", "max_running", "keys", "held"):
            assert set(controlled[side]["cpu_us_per_task"]) == set(spent)  # by process, as the drain's
        shown = report.table({"valka": {"controls": controlled}})
        assert f"|   ÷ the unlimited drain beside it | ratio | ≥ 0.90 | {controlled['max_running']['ratio']:.2f} |" \
            in shown
        assert "|   CPU per task: all, max_running | µs CPU |" in shown
        assert f"|   max_running ÷ this bound | ratio |  | {capped_to_bound:.2f} |" in shown
        # A limited claim's cost with none and with some of its queue's tasks running; nothing left behind.
        cost = limited_claim.measure(database_url(), running=200)
        assert cost["running"] == 200 and cost["none_running_ms"] > 0 and cost["running_ms"] > 0
        assert cost["ratio"] == cost["running_ms"] / cost["none_running_ms"]
        assert not Task.objects.filter(queue=limited_claim.QUEUE).exists()
        assert f"| limited claim of 64, 200 running | ms |  | {cost['running_ms']:.1f} |" \
            in report.table({"valka": {"controls": {"claim_cost": cost}}})
        assert Task.objects.filter(queue=drain.KEYED_QUEUE).values("concurrency_key").distinct().count() == 30
        with floor_table():  # with the floors in turns with the enqueues
            waited = drain.latency(database_url(), count=5, rate=50, hop_log=hop_log, floor_url=database_url())
            with psycopg.connect(database_url(), autocommit=True) as conn:
                committed = conn.execute("SELECT count(*) FROM floor_jobs WHERE queue = 'latency'").fetchone()[0]
        assert waited["commit_floor"]["samples"] == committed == 5 and waited["commit_floor"]["p50_ms"] > 0
        # Each relayed row arrived in the receiving process after its INSERT + NOTIFY was called.
        relayed = waited["delivery_floor"]
        assert relayed["samples"] == relayed["from_call"]["samples"] == 5
        assert 0 < relayed["from_call"]["p50_ms"] <= relayed["from_call"]["p99_ms"] < 5000
        assert relayed["p50_ms"] <= relayed["from_call"]["p50_ms"]
        # From the call's start a handler cannot have started yet; from its return it can seem to
        # have, on a busy machine that runs the worker before the enqueuing thread again.
        assert waited["samples"] == 5 and waited["p50_ms"] <= waited["p99_ms"] < 5000
        assert 0 < waited["from_call"]["p50_ms"] <= waited["from_call"]["p99_ms"] < 5000
        # Each task inserted on its own is named by its NOTIFY, so its hops have their moments; but
        # one a claim woken by another task's freed slot took before its NOTIFY was read is not
        # followed (dispatcher/hops.py), which a busy machine now and then allows.
        assert 0 < waited["hops"]["samples"] <= 5
        hop = waited["hops"][drain.HOPS[3][0]]  # the claim itself
        assert 0 < hop["p50_ms"] <= hop["p99_ms"] < 5000
        shown = report.table({"valka": {"latency": waited}})
        assert "| claim (CLAIM_IDS or CLAIM, one round trip) |" in shown
        assert f"|   a bare INSERT + commit beside it, p99 | ms |  | {waited['commit_floor']['p99_ms']:.1f} |" in shown
        assert (f"|   the delivery floor beside it, p99, from the return | ms |  | {relayed['p99_ms']:.1f} |"
                in shown)
    finally:
        stack.stop_all()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_cpu_is_counted_for_a_process_and_for_postgresql():
    import subprocess
    import sys
    from pathlib import Path

    from bench import cpu
    from valka.devdb import wait_for

    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.4\n"
                             "while time.process_time() < end: pass\nprint('done', flush=True)\ntime.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        sample = cpu.sampler({"busy": [busy.pid]}, postgres=cpu.postmaster(database_url()))
        first = sample()
        with psycopg.connect(database_url()) as conn:  # a backend that works, then ends
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            conn.execute("SELECT count(*) FROM generate_series(1, 3000000)").fetchone()
        assert busy.stdout.readline() == "done\n"  # its 0.4 s of CPU are spent
        # Gone from /proc once the postmaster has reaped it, and its CPU has moved to the postmaster's count.
        wait_for(lambda: not Path(f"/proc/{backend}").exists(), 30, "the backend's end")
        last = sample()
    finally:
        busy.kill()
        busy.wait()
        busy.stdout.close()
    assert last["busy"] >= 0.39
    assert cpu.per_task(first, last, 2)["postgres"] >= 0.05e6  # the ended backend's work, by task of 2
    assert cpu.medians([{"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 4.0}, {"a": 2.0, "b": 9.0}]) == \
        {"a": 2.0, "b": 4.0, "total": 7.0}


def test_percentiles_and_the_table():
    assert measure.percentile([5, 1, 4, 2, 3], 50) == 3
    assert measure.percentile(list(range(1, 101)), 99) == 99
    results = {"valka": {"drain": {"rate_per_s": 5000.0}, "latency": {"p50_ms": 2.0, "p99_ms": 6.0}},
               "peers": {"celery": {"drain": {"rate_per_s": 1000.0}, "latency": {"p50_ms": 3.0, "p99_ms": 4.0}}}}
    text = report.table(results)
    assert "| drain (no-op tasks) | tasks/s |  | 5,000 | 1,000 | 5.0× |" in text
    assert "| idle-worker latency p50, from enqueue's return | ms | ≤ Celery | 2.0 | 3.0 | 1.5× |" in text
    results["valka"]["grpc_floor"] = {"rate_per_s": 6250.0}
    assert "|   ÷ the gRPC floor, 1 worker | ratio | ≥ 0.80 | 0.80 | — | — |" in report.table(results)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_the_concurrent_insert_floor_counts_what_its_processes_committed(monkeypatch):
    from bench import floor

    monkeypatch.setattr(floor, "CONCURRENT_SECONDS", 0.5)
    with floor_table():
        for notify in (False, True):
            result = floor.enqueue_concurrent(database_url(), callers=2, notify=notify)
            with psycopg.connect(database_url(), autocommit=True) as conn:
                rows = conn.execute("SELECT count(*) FROM floor_jobs WHERE queue = 'concurrent'").fetchone()[0]
                conn.execute("DELETE FROM floor_jobs")
            assert result["count"] == rows > 0 and result["notify"] is notify
            assert result["rate_per_s"] == rows / 0.5


@pytest.mark.django_db(transaction=True)
def test_the_single_enqueue_takes_turns_with_its_floors(quiet):
    from bench import enqueue

    with floor_table():
        beside = enqueue.in_process_in_turns(4, floor_url=database_url(), database_url=database_url(), rounds=2)
    for side in ("valka", "floor", "tasks_table"):
        assert len(beside[side]["rounds"]) == 2 and beside[side]["rate_per_s"] > 0
    assert Task.objects.filter(queue=enqueue.ENQUEUE_QUEUE).count() == 8
    enqueue.cleanup(database_url())
    shown = report.table({"valka": {"enqueue": {"in_process_x1": beside["valka"]},
                                    "floor": {"enqueue_single": beside["floor"]}}})
    ratio = beside["valka"]["rate_per_s"] / beside["floor"]["rate_per_s"]
    assert f"|   ÷ the INSERT + commit floor, 1 caller | ratio | ≥ 0.70 | {ratio:.2f} |" in shown


@pytest.mark.django_db(transaction=True)
def test_the_tasks_table_insert_floor_writes_its_rows_and_removes_them():
    from bench import floor

    result = floor.enqueue_tasks_table(database_url(), 5)
    assert result["count"] == 5 and result["rate_per_s"] > 0
    assert not Task.objects.filter(queue=floor.TASKS_TABLE_QUEUE).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_djangos_task_api_workloads(tmp_path, quiet, monkeypatch):
    from bench import django_tasks, enqueue, floor, http_load
    from tasks.api.auth import api_key_create

    monkeypatch.setattr(floor, "CONCURRENT_SECONDS", 0.3)
    stack = BenchStack(database_url(), tmp_path)
    try:
        hop_log = tmp_path / "hops.jsonl"
        _, addr = stack.dispatcher(VALKA_DISPATCH_HOP_LOG=str(hop_log), VALKA_API_ANONYMOUS="false")
        _, web = stack.web()
        _, web_floor = stack.web(app="bench.web_floor:app", BENCH_FLOOR_URL=database_url())
        key = api_key_create(name="bench", scope="write")[1]
        with floor_table():  # REST single, in turns with the 8-caller floors it is held to
            rest = enqueue.rest_single_in_turns(web, key, 16, floor_url=database_url(), web_floor_url=web_floor,
                                                rounds=2)
            web_rows = floor_rows("web")
        for side in ("rest_x8", "enqueue_x8", "enqueue_x8_notify", "web_x8"):
            assert len(rest[side]["rounds"]) == 2 and rest[side]["rate_per_s"] > 0
        assert web_rows == 32  # the web floor stored every request's body
        assert Task.objects.filter(queue=enqueue.ENQUEUE_QUEUE).count() == 32
        enqueue.cleanup(database_url())
        # The load's client reads every answer: a refused request stops it, named.
        with pytest.raises(http_load.LoadError, match="answered 401"):
            enqueue.rest_single(web, "not-a-key", 4, clients=2)
        assert not Task.objects.filter(queue=enqueue.ENQUEUE_QUEUE).exists()
        created = enqueue.grpc_single(addr, key, 16, clients=2)  # ApiService/CreateTask, with the key
        assert created["count"] == 16 and Task.objects.filter(queue=enqueue.ENQUEUE_QUEUE).count() == 16
        enqueue.cleanup(database_url())
        local = django_tasks.enqueue_in_process(20)
        remote = django_tasks.enqueue_remote(web, key, 20)
        for result in (local, remote):
            assert result["count"] == 20 and result["rate_per_s"] > 0 and result["ratio"] > 0
        stack.django_worker(addr, web, concurrency=8, queue=django_tasks.DRAIN_QUEUE)
        drained = drain.drain(database_url(), n=30, rounds=1, queue=django_tasks.DRAIN_QUEUE,
                              task_name=django_tasks.NOOP, timeout=30)
        assert drained["n"] == 30 and drained["rate_per_s"] > 0
    finally:
        stack.stop_all()
    results = {"valka": {"django": {"drain": {"rate_per_s": 1000.0}, "enqueue_in_process": local}},
               "peers": {"django-tasks-db": {"django_drain": {"rate_per_s": 100.0}}}}
    assert "| drain, Django @task no-ops, 1 valka_worker | tasks/s | ≥ 5× django-tasks-db | 1,000 |" \
        in report.table(results)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_the_schedules_workloads_on_a_real_stack(tmp_path, quiet):
    from bench import schedules

    stack = BenchStack(database_url(), tmp_path)
    try:
        hop_log = tmp_path / "hops.jsonl"
        _, addr = stack.dispatcher(VALKA_DISPATCH_HOP_LOG=str(hop_log))
        stack.workers(addr, count=1, concurrency=8, queues=[drain.DRAIN_QUEUE])
        fired = schedules.fire(stack, count=30, drain_n=20, cron=False, lead=3.0)
        assert fired["fired"] == 30 and 0 < fired["seconds"] < 30, fired
        assert fired["drain_before"]["n"] == fired["drain_beside"]["n"] == fired["drain_after"]["n"] == 20
        assert fired["beside_ratio"] > 0
        idle = schedules.idle(stack, count=30, seconds=1.0, settle=0.5)
        assert idle["schedules"] == 30 and 0 <= idle["cpu_percent"] < 100 and idle["seconds"] >= 1.0
    finally:
        stack.stop_all()
    text = report.table({"valka": {"schedules": {"fire": fired, "idle": idle}}})
    assert "| schedules: fire 10,000 due at one slot | s | < 5 |" in text


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_what_tracing_costs_on_the_hot_paths(quiet):
    from opentelemetry import trace

    from bench import tracing

    enqueued = tracing.enqueue(20, rounds=1)
    ran = tracing.worker(50, rounds=1)
    for figures in (enqueued, ran):
        assert figures["off_us"] > 0 and figures["on_us"] > 0 and len(figures["on_rounds_us"]) == 1
    assert set(tracing.checks(number=100)) == {"tracer", "carrier", "headers"}
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider), "no provider left behind"
    tracing.cleanup(database_url())


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_the_big_table_takes_turns_with_the_empty_one(tmp_path, quiet):
    from bench import scale

    queues = [drain.DRAIN_QUEUE, drain.LATENCY_QUEUE]
    stack = BenchStack(database_url(), tmp_path)
    try:
        _, addr = stack.dispatcher(VALKA_DISPATCH_HOP_LOG=str(tmp_path / "hops.jsonl"))
        stack.workers(addr, count=1, concurrency=8, queues=queues)
        with scale.big_database(database_url(), tmp_path / "big", finished=300, future=30, workers=1,
                                concurrency=8, queues=queues) as (big_url, seeded):
            assert seeded["rows"] == 330
            result = scale.alternate(database_url(), big_url, n=20, rounds=1, latency_count=8, latency_rate=50,
                                     hop_logs={"empty": tmp_path / "hops.jsonl",
                                               "big": tmp_path / "big" / scale.HOP_LOG})
            # The sides' enqueues of the latency take turns one by one, each to its own database.
            urls = {"empty": database_url(), "big": big_url}
            moments = scale.stamps_in_turns(urls, count=4, rate=50)
            calls = sorted((call, side) for side in scale.SIDES for call, _, _ in moments[side].values())
            assert [side for _, side in calls] == scale.turns(4)
            # Each side's tasks went to its own database, through Django and through psycopg alike.
            with psycopg.connect(big_url, autocommit=True) as conn:
                big_drained = conn.execute("SELECT count(*) FROM tasks WHERE queue = %s AND status = 'COMPLETED'",
                                           (drain.DRAIN_QUEUE,)).fetchone()[0]
                big_stamped = conn.execute("SELECT count(*) FROM tasks WHERE queue = %s AND id = ANY(%s)",
                                           (drain.LATENCY_QUEUE, list(moments["big"]))).fetchone()[0]
            assert big_stamped == 4 and Task.objects.filter(id__in=list(moments["empty"])).count() == 4
        warmed_up = min(20, scale.WARM_UP_DRAIN)
        assert Task.objects.filter(queue=drain.DRAIN_QUEUE, status="COMPLETED").count() == warmed_up + 20
        assert Task.objects.filter(queue=drain.LATENCY_QUEUE).count() == scale.WARM_UP_LATENCY + 8 + 4
        assert big_drained == 150 + warmed_up + 20  # the seed's finished half in that queue, then as here
    finally:
        stack.stop_all()
    with psycopg.connect(database_url(), autocommit=True) as conn:
        assert not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                (psycopg.conninfo.conninfo_to_dict(big_url)["dbname"],)).fetchone()
    for side in scale.SIDES:
        figures = result["drain"][side]
        assert len(figures["rounds"]) == 1 and figures["n"] == 20
        assert 0 < figures["min_per_s"] <= figures["rate_per_s"] <= figures["max_per_s"]
        waited = result["latency"][side]
        assert waited["samples"] == 8 and len(waited["chunk_p99_ms"]) == 4
        assert waited["chunk_p99_min_ms"] <= waited["p99_ms"] <= waited["chunk_p99_max_ms"]
        assert 0 < waited["hops"]["samples"] <= 8  # each side's dispatcher logged its own tasks' hops
    assert result["drain"]["ratio"] == result["drain"]["big"]["rate_per_s"] / result["drain"]["empty"]["rate_per_s"]
    # A p99 of eight samples from the enqueue's return can be below zero on a loaded machine (every
    # handler started before its producer's call returned), so the ratio is checked, not its sign.
    latency = result["latency"]
    assert latency["ratio_p99"] == latency["big"]["p99_ms"] / latency["empty"]["p99_ms"] and latency["chunks"] == 4
    text = report.table({"valka": {"scale": result}})
    assert "| drain, big table | tasks/s | within 10% |" in text
    assert "|   big ÷ empty (medians) | ratio | ≥ 0.90 |" in text
    assert "| latency p99, big table | ms | within 10% |" in text
    assert "| hop | empty table | big table |" in text


def test_sigterm_ends_a_run_through_its_cleanups(tmp_path):
    """`make bench` killed with SIGTERM stops its stack and its PostgreSQL on the way out, as after Ctrl-C."""
    marker = tmp_path / "cleaned"
    script = ("import time\n"
              "from bench.interrupt import stop_on_sigterm\n"
              "stop_on_sigterm()\n"
              "try:\n"
              "    print('ready', flush=True)\n"
              "    time.sleep(60)\n"
              "finally:\n"
              "    print('cleaning', flush=True)\n"
              "    time.sleep(0.5)\n"
              f"    open({str(marker)!r}, 'w').write('stopped')\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline() == "cleaning\n"
    proc.send_signal(signal.SIGTERM)  # a second one, mid-cleanup, does not cut it short
    assert proc.wait(timeout=10) != 0
    assert marker.read_text() == "stopped"


def test_an_interrupted_run_gives_its_peer_runner_time_to_clean_up(tmp_path):
    """SIGTERM to the run reaches the peers' runner as SIGTERM, not SIGKILL: its own cleanups run."""
    ready, marker = tmp_path / "ready", tmp_path / "cleaned"
    child = ("import time\n"
             "from bench.interrupt import stop_on_sigterm\n"
             "stop_on_sigterm()\n"
             "try:\n"
             f"    open({str(ready)!r}, 'w').close()\n"
             "    time.sleep(60)\n"
             "finally:\n"
             f"    open({str(marker)!r}, 'w').write('stopped')\n")
    parent = ("import sys\n"
              "from bench.interrupt import run_to_end, stop_on_sigterm\n"
              "stop_on_sigterm()\n"
              f"run_to_end([sys.executable, '-c', {child!r}])\n")
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=ROOT)
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) != 0
    assert marker.read_text() == "stopped"


def test_run_to_end_answers_the_output_and_raises_on_failure():
    assert run_to_end([sys.executable, "-c", "print('figures')"]).stdout == "figures\n"
    with pytest.raises(subprocess.CalledProcessError) as failed:
        run_to_end([sys.executable, "-c", "print('partial'); raise SystemExit(3)"])
    assert failed.value.returncode == 3 and failed.value.output == "partial\n"
