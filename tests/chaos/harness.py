"""The chaos run: the real stack on loopback, broken on purpose, then checked.

    python -m tests.chaos.harness --tasks 10000      # `make chaos`

Starts a private PostgreSQL, two dispatchers, two schedulers, the web app and
several SDK worker processes; enqueues N tasks that sleep a little and
sometimes fail retryably or for good; meanwhile SIGKILLs and restarts
workers, dispatchers and the scheduler leader, restarts PostgreSQL once,
cancels some tasks and signals others. When every task has settled it checks
that nothing was lost or done twice, and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

from tasks.sql.dashboard import COUNTER_TOTALS
from valka import devdb
from valka.devdb import free_port, listening

ROOT = Path(__file__).resolve().parents[2]
FINAL = ("COMPLETED", "FAILED", "DEAD_LETTER", "CANCELLED")
NOT_FINAL = "status NOT IN ('COMPLETED', 'FAILED', 'DEAD_LETTER', 'CANCELLED')"
# The throughput counter (tasks/sql/schema/counters.sql) that counts the tasks moved into each final status.
COUNTED_AS = {"COMPLETED": "completed", "FAILED": "failed", "DEAD_LETTER": "dead_lettered", "CANCELLED": "cancelled"}
MAX_RETRIES = 2

SIDE_TABLE = """
CREATE TABLE IF NOT EXISTS chaos_executions (
    id bigserial PRIMARY KEY, task_id uuid NOT NULL, run_id uuid NOT NULL, attempt int NOT NULL,
    worker text NOT NULL, pid int NOT NULL, phase text NOT NULL, output jsonb, at timestamptz DEFAULT now())
"""


@dataclass
class Proc:
    name: str
    cmd: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen | None = None
    restarts: int = 0

    def start(self) -> None:
        out = open(self.log, "ab")
        self.popen = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)

    def kill(self) -> None:
        if self.popen and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass
class Report:
    tasks: int = 0
    executions: int = 0
    kills: dict[str, int] = field(default_factory=dict)
    recovery_after_dispatcher_kill: list[float] = field(default_factory=list)
    recovery_after_pg_restart: float | None = None
    cancelled: int = 0
    signals: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
            f"chaos: {self.tasks} tasks, {self.executions} executions in {self.seconds:.1f} s",
            f"  final statuses: {json.dumps(self.statuses, sort_keys=True)}",
            f"  kills survived: {json.dumps(self.kills, sort_keys=True)}; cancelled {self.cancelled}, "
            f"signals sent {self.signals}",
            "  recovery after a dispatcher kill (first completion after it): "
            + (", ".join(f"{r:.2f}s" for r in self.recovery_after_dispatcher_kill) or "n/a"),
            "  recovery after the PostgreSQL restart: "
            + (f"{self.recovery_after_pg_restart:.2f}s" if self.recovery_after_pg_restart is not None else "n/a"),
            f"  problems: {len(self.problems)}",
        ]
        lines += [f"    - {p}" for p in self.problems[:30]]
        return "\n".join(lines)


class Chaos:
    def __init__(self, tasks: int, workers: int, seconds: float, seed: int, folder: Path) -> None:
        self.n = tasks
        self.n_workers = workers
        self.budget = seconds
        self.rng = random.Random(seed)
        self.folder = folder
        self.cluster = devdb.Cluster(folder / "pg", free_port(), durable=False)
        self.report = Report(tasks=tasks)
        self.procs: list[Proc] = []

    # -- setup --
    def env(self, **extra: str) -> dict[str, str]:
        return dict(os.environ, DATABASE_URL=self.cluster.url, PYTHONUNBUFFERED="1", VALKA_DB_POOL="false",
                    VALKA_DEVELOPMENT="true",
                    VALKA_API_ANONYMOUS="true", VALKA_RETRY_BASE_DELAY="0.2", VALKA_RETRY_MAX_DELAY="2",
                    VALKA_REAPER_INTERVAL="1", VALKA_DISPATCHING_TIMEOUT="5", VALKA_WORKER_TIMEOUT="10",
                    VALKA_SCHEDULER_MAX_SLEEP="0.5", VALKA_DISPATCH_POLL_INTERVAL="1", VALKA_LEASE_EXTENSION="10",
                    VALKA_SHUTDOWN_TIMEOUT="7", VALKA_SIGNAL_DELIVERY_WAIT="0", VALKA_LOG_LEVEL="WARNING", **extra)

    def proc(self, name: str, cmd: list[str], **extra: str) -> Proc:
        p = Proc(name, cmd, self.env(**extra), self.folder / f"{name}.log")
        p.start()
        self.procs.append(p)
        return p

    def setup(self) -> None:
        self.cluster.start()
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=self.env(), check=True)
        with self.db() as conn:
            conn.execute(SIDE_TABLE)
        py = sys.executable
        self.ports = [free_port(), free_port()]
        self.dispatchers = [self.proc(f"dispatcher-{i}", [py, "manage.py", "run_dispatcher", "--addr",
                                                          f"127.0.0.1:{port}"])
                            for i, port in enumerate(self.ports)]
        self.schedulers = [self.proc(f"scheduler-{i}", [py, "manage.py", "run_scheduler"]) for i in range(2)]
        self.web_port = free_port()
        self.web = self.proc("web", [py, "-m", "uvicorn", "valka.asgi:application", "--host", "127.0.0.1",
                                     "--port", str(self.web_port), "--no-access-log"])
        for port in [*self.ports, self.web_port]:
            self.wait(lambda port=port: listening(port), 30, f"port {port}")
        servers = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        self.workers = []
        for i in range(self.n_workers):
            # Half prefer each dispatcher; all fail over to the other one.
            order = servers if i % 2 == 0 else ",".join(reversed(servers.split(",")))
            self.workers.append(self.proc(f"worker-{i}", [py, "-m", "tests.chaos.chaos_worker"],
                                          CHAOS_SERVERS=order, CHAOS_DSN=self.cluster.url, CHAOS_NAME=f"w{i}"))

    def db(self) -> psycopg.Connection:
        return psycopg.connect(self.cluster.url, autocommit=True, connect_timeout=5)

    def query(self, sql: str, params: object = None, retries: int = 50) -> list[tuple]:
        for attempt in range(retries):
            try:
                with self.db() as conn:
                    return conn.execute(sql, params).fetchall()
            except psycopg.OperationalError:
                if attempt == retries - 1:
                    raise
                time.sleep(0.2)
        return []

    @staticmethod
    def wait(predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"chaos: timed out waiting for {what}")
            time.sleep(0.05)

    def enqueue(self) -> None:
        kinds = self.rng.choices(["ok", "flaky", "fatal", "exhaust"], weights=[80, 12, 4, 4], k=self.n)
        sleeps = [self.rng.randint(100, 700) for _ in range(self.n)]
        with self.db() as conn:
            conn.execute(
                "INSERT INTO tasks (id, task_name, queue, status, priority, max_retries, attempt_count,"
                " timeout_seconds, input, metadata, run_at, created_at, updated_at)"
                " SELECT valka_uuid7(), 'chaos', 'chaos', 'PENDING', 0, %s, 0, 30,"
                " jsonb_build_object('i', g.i, 'kind', g.kind, 'sleep_ms', g.sleep_ms), '{}', now(), now(), now()"
                " FROM unnest(%s::int[], %s::text[], %s::int[]) AS g(i, kind, sleep_ms)",
                (MAX_RETRIES, list(range(self.n)), kinds, sleeps))
            conn.execute("SELECT pg_notify('valka_task_ready', 'chaos')")

    # -- the chaos --
    def last_completion(self) -> float:
        rows = self.query("SELECT extract(epoch FROM max(finished_at)) FROM tasks WHERE status = 'COMPLETED'")
        return float(rows[0][0] or 0)

    def recovery(self, since: float, timeout: float = 60) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.last_completion() > since:
                return time.time() - since
            if not self.unsettled():
                return None
            time.sleep(0.05)
        return None

    def unsettled(self) -> int:
        rows = self.query(f"SELECT count(*) FROM tasks WHERE {NOT_FINAL}")
        return rows[0][0]

    def bump(self, what: str) -> None:
        self.report.kills[what] = self.report.kills.get(what, 0) + 1

    def kill_worker(self) -> None:
        victim = self.rng.choice(self.workers)
        victim.kill()
        self.bump("worker")
        time.sleep(self.rng.uniform(0.1, 0.5))
        victim.start()
        victim.restarts += 1

    def kill_dispatcher(self) -> None:
        victim = self.rng.choice(self.dispatchers)
        victim.kill()
        self.bump("dispatcher")
        at = time.time()
        time.sleep(self.rng.uniform(0.2, 1.0))
        victim.start()
        victim.restarts += 1
        port = int(victim.cmd[-1].rsplit(":", 1)[1])
        self.wait(lambda: listening(port), 30, "restarted dispatcher")
        rec = self.recovery(at)
        if rec is not None:
            self.report.recovery_after_dispatcher_kill.append(rec)

    def kill_scheduler_leader(self) -> None:
        rows = self.query("SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                          " WHERE l.locktype = 'advisory' AND l.granted")
        pids = {int(name.split()[1]) for (name,) in rows if name and name.startswith("valka-scheduler")}
        for proc in self.schedulers:
            if proc.popen and proc.popen.pid in pids:
                proc.kill()
                self.bump("scheduler leader")
                time.sleep(0.3)
                proc.start()
                proc.restarts += 1
                return

    def restart_postgres(self) -> None:
        at = time.time()
        self.cluster.stop("fast")
        self.bump("postgres restart")
        time.sleep(0.5)
        self.cluster.start()
        self.report.recovery_after_pg_restart = self.recovery(at, timeout=90)

    def cancel_some(self) -> None:
        rows = self.query("SELECT id FROM tasks WHERE status IN ('PENDING', 'RUNNING') ORDER BY random() LIMIT 3")
        for (task_id,) in rows:
            r = httpx.post(f"http://127.0.0.1:{self.web_port}/api/v1/tasks/{task_id}/cancel", timeout=10)
            if r.status_code == 200:
                self.report.cancelled += 1
            elif r.status_code != 409:
                self.report.problems.append(f"cancel {task_id}: {r.status_code} {r.text[:200]}")

    def signal_some(self) -> None:
        rows = self.query("SELECT id FROM tasks WHERE status = 'RUNNING' ORDER BY random() LIMIT 3")
        for (task_id,) in rows:
            r = httpx.post(f"http://127.0.0.1:{self.web_port}/api/v1/tasks/{task_id}/signal",
                           json={"signal_type": "progress_request", "payload": {"n": 1}}, timeout=10)
            if r.status_code == 201:
                self.report.signals += 1
            elif r.status_code != 409:
                self.report.problems.append(f"signal {task_id}: {r.status_code} {r.text[:200]}")

    def run(self) -> Report:
        self.setup()  # a new cluster, migrations, nine processes: not part of the budget
        started = time.monotonic()
        self.enqueue()
        actions = [self.kill_worker] * 4 + [self.kill_dispatcher] * 2 + [self.kill_scheduler_leader] * 2 + \
                  [self.cancel_some] * 2 + [self.signal_some] * 2
        # Every kind of trouble at least once, in random order, PostgreSQL's restart in the middle;
        # then more of them at random while work remains.
        first = [self.kill_worker, self.kill_dispatcher, self.kill_scheduler_leader, self.cancel_some,
                 self.signal_some, self.kill_worker]
        self.rng.shuffle(first)
        first.insert(len(first) // 2, self.restart_postgres)
        chaos_until = started + self.budget * 0.7
        while time.monotonic() < chaos_until and self.unsettled():
            time.sleep(self.rng.uniform(0.3, 1.0))
            (first.pop(0) if first else self.rng.choice(actions))()
        # Quiet period: everything must settle by itself.
        deadline = started + self.budget
        while self.unsettled() and time.monotonic() < deadline:
            time.sleep(0.5)
        self.report.seconds = time.monotonic() - started
        self.check()
        return self.report

    # -- the checks --
    def check(self) -> None:
        p = self.report.problems
        rows = self.query("SELECT status, count(*) FROM tasks GROUP BY status")
        self.report.statuses = {s: c for s, c in rows}
        self.report.executions = self.query("SELECT count(*) FROM chaos_executions WHERE phase = 'start'")[0][0]
        stuck = self.query("SELECT t.id, t.status FROM tasks t WHERE t.status IN ('DISPATCHING', 'RUNNING')"
                           " AND NOT EXISTS (SELECT 1 FROM task_runs r WHERE r.task_id = t.id"
                           " AND r.status = 'RUNNING' AND r.lease_expires_at > now())")
        p += [f"task {t} stuck in {s} without a live lease" for t, s in stuck]
        waiting = self.query(f"SELECT count(*) FROM tasks WHERE {NOT_FINAL}")[0][0]
        if waiting:
            p.append(f"{waiting} tasks did not settle within the time budget")
        bad_completed = self.query("""
            SELECT t.id FROM tasks t WHERE t.status = 'COMPLETED' AND (
                (SELECT count(*) FROM task_runs r WHERE r.task_id = t.id AND r.status = 'COMPLETED') <> 1
                OR NOT EXISTS (SELECT 1 FROM chaos_executions e JOIN task_runs r ON r.id = e.run_id
                               WHERE e.task_id = t.id AND e.phase = 'done' AND r.status = 'COMPLETED'
                                 AND e.output = t.output))""")
        p += [f"COMPLETED task {t} lacks exactly one successful run with its handler's output"
              for (t,) in bad_completed]
        bad_dead = self.query("""
            SELECT t.id FROM tasks t WHERE t.status = 'DEAD_LETTER' AND (
                (SELECT count(*) FROM dead_letter_queue d WHERE d.task_id = t.id) <> 1
                OR (SELECT count(*) FROM task_runs r WHERE r.task_id = t.id) <> t.max_retries + 1
                OR t.attempt_count <> t.max_retries + 1)""")
        p += [f"DEAD_LETTER task {t} lacks one dead letter or max_retries + 1 runs" for (t,) in bad_dead]
        # A fatal task's handler raises NonRetryableError once it has recorded its start: nothing may
        # follow that run. An earlier attempt may fail retryably before its start is recorded (the
        # side table's database restarting), and be retried.
        retried_failed = self.query("""
            SELECT t.id FROM tasks t JOIN task_runs f ON f.task_id = t.id AND f.status = 'FAILED'
            WHERE t.status = 'FAILED'
              AND EXISTS (SELECT 1 FROM chaos_executions e WHERE e.run_id = f.id AND e.phase = 'start')
              AND EXISTS (SELECT 1 FROM task_runs later
                          WHERE later.task_id = t.id AND later.attempt_number > f.attempt_number)""")
        p += [f"FAILED task {t} was retried after failing for good" for (t,) in retried_failed]
        overlaps = self.query("""
            SELECT DISTINCT a.task_id FROM task_runs a JOIN task_runs b ON a.task_id = b.task_id AND a.id < b.id
            WHERE tstzrange(a.started_at, COALESCE(a.finished_at, 'infinity'))
               && tstzrange(b.started_at, COALESCE(b.finished_at, 'infinity'))""")
        p += [f"task {t} had two overlapping runs" for (t,) in overlaps]
        double_done = self.query("SELECT task_id FROM chaos_executions WHERE phase = 'done' GROUP BY task_id"
                                 " HAVING count(DISTINCT run_id) > 1 AND bool_or(true)")
        # A handler may finish twice only when its first run was lost (at least once delivery).
        for (task_id,) in double_done:
            lost = self.query("SELECT count(*) FROM task_runs WHERE task_id = %s AND status = 'LOST'", (task_id,))
            if not lost[0][0]:
                p.append(f"task {task_id} completed twice without a lost run")
        # The counts that the tasks table's triggers append in each statement's transaction, and
        # the scheduler's fold moves while it is being killed, agree with the tasks themselves.
        counted: dict[str, int] = {}
        for _queue, kind, n in self.query(COUNTER_TOTALS):
            counted[kind] = counted.get(kind, 0) + n
        expected = {"created": sum(self.report.statuses.values()),
                    **{kind: self.report.statuses.get(status, 0) for status, kind in COUNTED_AS.items()}}
        p += [f"the {kind} counter says {counted.get(kind, 0)}, the tasks table {n}"
              for kind, n in expected.items() if counted.get(kind, 0) != n]
        for proc in self.procs:
            if not proc.alive():
                p.append(f"{proc.name} is not running at the end (exit {proc.popen.returncode})")

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
        try:
            self.cluster.stop("immediate")
        except devdb.DevDBError:
            pass


def run_chaos(tasks: int, workers: int, seconds: float, seed: int) -> Report:
    """Run the chaos; its folder (logs and the cluster) is removed after a clean run and kept,
    with its path printed, after problems or an error."""
    folder = Path(tempfile.mkdtemp(prefix="valka-chaos-"))
    chaos = Chaos(tasks, workers, seconds, seed, folder)
    clean = False
    try:
        report = chaos.run()
        clean = not report.problems
        return report
    finally:
        chaos.stop()
        if clean:
            chaos.cluster.remove_files()
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"chaos: logs kept in {folder}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.harness")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "valka.settings")
    report = run_chaos(args.tasks, args.workers, args.seconds, args.seed)
    print(report.summary())
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
