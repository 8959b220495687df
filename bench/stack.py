"""The processes a benchmark runs against: its own durable PostgreSQL, the dispatcher, the web
app and SDK workers, all on loopback. Everything started here is stopped by `stop_all()`.
Further databases on the same server come and go with `create_database` and `drop_database`,
and `django_database` points the benchmark's own Django connection at one of them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from valka import devdb
from valka.devdb import listening, wait_for

ROOT = Path(__file__).resolve().parent.parent


def rss_kib(pid: int) -> int:
    """Resident memory of a process, from /proc (KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@contextlib.contextmanager
def cluster(durable: bool = True) -> Iterator[devdb.Cluster]:
    """A private PostgreSQL (fsync on unless durable=False) in a temporary folder, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="valka-bench-pg-"))
    pg = devdb.Cluster(folder, devdb.free_port(), durable=durable)
    try:
        pg.start()
        yield pg
    finally:
        try:
            pg.stop("immediate")
        finally:
            pg.remove_files()


def create_database(admin_url: str, name: str) -> str:
    """Create database `name` on the server of `admin_url` (if missing); returns its URL."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


def drop_database(admin_url: str, name: str) -> None:
    """Drop database `name` on the server of `admin_url` if it is there, ending its sessions."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def django_database(database_url: str) -> Iterator[None]:
    """Point this thread's Django default connection at `database_url` for the block, then back.

    What goes through that connection (tasks.services' enqueue, tasks.dashboard's counters)
    reaches `database_url` meanwhile. The connection is closed at each switch, and its pool
    with it (Django keys pools by alias, not by database); the new one is opened before the
    block runs, so a timed call in it does not pay for the connection."""
    from django.db import connection

    if connection.in_atomic_block:
        raise RuntimeError("django_database() inside a transaction would leave it behind")
    original = connection.settings_dict
    switched = _settings_for(database_url, original)

    def switch(settings: dict[str, Any]) -> None:
        connection.close()
        connection.close_pool()
        connection.settings_dict = settings

    switch(switched)
    try:
        connection.ensure_connection()
        yield
    finally:
        switch(original)


@contextlib.contextmanager
def django_databases(database_urls: dict[str, str]) -> Iterator[Callable[[str], None]]:
    """Django's default connection in this thread, open to each of `database_urls` (by name) at
    once: the block is given `use(name)`, which puts that one in place at no cost, so that calls
    to two databases can take turns one by one. Each is a connection of its own, outside Django's
    pool (which is keyed by alias, not by database), opened before the block; the thread's own
    connection is put back afterwards."""
    from django.db import DEFAULT_DB_ALIAS, connections

    own = connections[DEFAULT_DB_ALIAS]
    wrappers: dict[str, Any] = {}
    try:
        for name, url in database_urls.items():
            settings = _settings_for(url, own.settings_dict)
            settings["OPTIONS"] = {k: v for k, v in settings["OPTIONS"].items() if k != "pool"}
            wrappers[name] = type(own)(settings, DEFAULT_DB_ALIAS)
            wrappers[name].ensure_connection()

        def use(name: str) -> None:
            setattr(connections._connections, DEFAULT_DB_ALIAS, wrappers[name])

        yield use
    finally:
        setattr(connections._connections, DEFAULT_DB_ALIAS, own)
        for wrapper in wrappers.values():
            wrapper.close()


def _settings_for(database_url: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Django's `settings` for a database, pointed at `database_url`'s."""
    given = conninfo_to_dict(database_url)
    switched = {**settings, "NAME": given["dbname"]}
    for key, setting in (("host", "HOST"), ("port", "PORT"), ("user", "USER"), ("password", "PASSWORD")):
        if key in given:
            switched[setting] = given[key]
    return switched


class BenchStack:
    """Starts the stack's processes against `database_url`; logs go to `workdir`."""

    def __init__(self, database_url: str, workdir: Path) -> None:
        self.database_url = database_url
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, DATABASE_URL=database_url, PYTHONUNBUFFERED="1", VALKA_LOG_LEVEL="WARNING",
                        VALKA_API_ANONYMOUS="true", VALKA_DEVELOPMENT="true")  # a local measurement: no keys
        self.env.pop("VALKA_DB_POOL", None)  # the processes run with their defaults

    def spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**self.env, **(env or {})}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        proc.name = name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def migrate(self) -> None:
        """The project's migrations on this stack's database, as a deployment runs them."""
        done = subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=self.env,
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"migrate on {self.database_url} failed:\n{done.stdout}{done.stderr}")

    def _await_port(self, proc: subprocess.Popen, port: int, what: str) -> None:
        wait_for(lambda: listening(port) or proc.poll() is not None, 60, what)
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited:\n{self.log_tail(proc)}")

    def dispatcher(self, **env: str) -> tuple[subprocess.Popen, str]:
        port = devdb.free_port()
        addr = f"127.0.0.1:{port}"
        proc = self.spawn(f"dispatcher-{port}", [sys.executable, "manage.py", "run_dispatcher", "--addr", addr], env)
        self._await_port(proc, port, f"the dispatcher on {addr}")
        return proc, addr

    def web(self, processes: int = 1, app: str = "valka.asgi:application", **env: str) -> tuple[subprocess.Popen, str]:
        """uvicorn serving `app` (the web app; bench.web_floor:app for the web floor)."""
        port = devdb.free_port()
        cmd = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1",
               "--port", str(port), "--no-access-log", "--log-level", "warning"]
        if processes > 1:
            cmd += ["--workers", str(processes)]
        proc = self.spawn(f"web-{port}", cmd, env)
        self._await_port(proc, port, f"uvicorn {app}")
        return proc, f"http://127.0.0.1:{port}"

    def workers(self, server: str, *, count: int, concurrency: int, queues: list[str],
                prefix: str = "bench") -> list[subprocess.Popen]:
        """Start `count` SDK worker processes and wait until the dispatcher has them all."""
        names = [f"{prefix}-{i}" for i in range(count)]
        procs = [self.spawn(f"worker-{name}", [sys.executable, "-m", "bench.worker_app"], {
            "BENCH_SERVER": server, "BENCH_QUEUES": ",".join(queues), "BENCH_CONCURRENCY": str(concurrency),
            "BENCH_NAME": name,
        }) for name in names]

        def connected() -> bool:
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a worker exited:\n{self.log_tail(proc)}")
            with psycopg.connect(self.database_url, autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM workers WHERE status = 'CONNECTED' AND name = ANY(%s)",
                                   (names,)).fetchone()
            return bool(row and row[0] == count)

        wait_for(connected, 60, f"{count} workers to connect", interval=0.2)
        return procs

    def django_worker(self, server: str, web: str, *, concurrency: int, queue: str) -> subprocess.Popen:
        """`manage.py valka_worker` of bench.django_project, waiting until the dispatcher has it."""
        proc = self.spawn("worker-django", [sys.executable, "-m", "django", "valka_worker", "--name", "bench-django",
                                            "--queue", queue, "--concurrency", str(concurrency)],
                          {"DJANGO_SETTINGS_MODULE": "bench.django_project.settings", "BENCH_SERVER": server,
                           "BENCH_VALKA_URL": web})

        def connected() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the Django worker exited:\n{self.log_tail(proc)}")
            with psycopg.connect(self.database_url, autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM workers WHERE status = 'CONNECTED' AND name = %s",
                                   ("bench-django",)).fetchone()
            return bool(row and row[0])

        wait_for(connected, 60, "the Django worker to connect", interval=0.2)
        return proc

    def stop(self, proc: subprocess.Popen, timeout: float = 10.0) -> None:
        """SIGTERM (a graceful drain), then SIGKILL if it lingers."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            self.stop(proc, timeout=5.0)

    def print_logs(self) -> None:
        """The end of each running process's log, on stderr: what a failed run shows."""
        for proc in self.procs:
            print(f"--- {proc.name}\n{self.log_tail(proc)}", file=sys.stderr)  # type: ignore[attr-defined]

    def log_tail(self, proc: subprocess.Popen, size: int = 3000) -> str:
        path = self.workdir / f"{proc.name}.log"  # type: ignore[attr-defined]
        return path.read_text(errors="replace")[-size:] if path.exists() else ""
