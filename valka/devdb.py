"""A project-local PostgreSQL cluster for development, tests and benchmarks.

`make run` keeps one cluster under `.valka/pg`; `make test` starts a throwaway
one for the length of a command. PostgreSQL refuses to run as root, so when we
are root the server binaries run as the unprivileged `postgres` user.

    python -m valka.devdb start [--dir D] [--port P]   # prints the DATABASE_URL
    python -m valka.devdb stop [--dir D]
    python -m valka.devdb exec --temp -- CMD ...      # CMD runs with DATABASE_URL set
"""

from __future__ import annotations

import argparse
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = ".valka/pg"
DEFAULT_PORT = 55432
DB_USER = "valka"
DB_NAME = "valka"


class DevDBError(RuntimeError):
    pass


def find_bindir() -> Path:
    """Locate initdb/pg_ctl: PATH, then `pg_config --bindir`, then Debian's layout."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if versions:
        return Path(versions[-1]).parent
    raise DevDBError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: install PostgreSQL 15 or newer "
        "(Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL to an existing database."
    )


def _server_user() -> str | None:
    """The user to run the server as, or None for the current one."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise DevDBError("running as root and no unprivileged 'postgres' user exists to run PostgreSQL")


def _as_server_user(cmd: list[str]) -> list[str]:
    user = _server_user()
    if user is None:
        return cmd
    if shutil.which("runuser"):
        return ["runuser", "-u", user, "--", *cmd]
    return ["su", user, "-s", "/bin/sh", "-c", " ".join(_quote(c) for c in cmd)]


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _chown_for_server(path: Path) -> None:
    user = _server_user()
    if user is None:
        return
    entry = pwd.getpwnam(user)
    for root, _dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for name in files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)
    # The server user must be able to reach the folder.
    for parent in path.resolve().parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            os.chmod(parent, mode | 0o001)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on host:port (the stack's processes are up)."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def wait_for(predicate: Callable[[], object], timeout: float = 45.0, what: str = "", *,
             interval: float = 0.05) -> object:
    """Poll `predicate` until it returns something true, and return that; TimeoutError after
    `timeout` seconds. How the test suite and the benchmark wait for their processes and rows."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what or predicate}")
        time.sleep(interval)


@dataclass
class Cluster:
    directory: Path
    port: int
    durable: bool = True

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def socket_dir(self) -> Path:
        # Unix socket paths are limited to ~107 bytes; fall back to a short folder.
        path = self.directory / "run"
        if len(str(path.resolve())) > 80:
            path = Path(tempfile.gettempdir()) / f"valka-pg-{self.port}"
        return path

    @property
    def url(self) -> str:
        return f"postgres://{DB_USER}@127.0.0.1:{self.port}/{DB_NAME}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = _as_server_user([str(find_bindir() / args[0]), *args[1:]])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise DevDBError(f"{args[0]} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def initialized(self) -> bool:
        return (self.data / "PG_VERSION").exists()

    def running(self) -> bool:
        if not self.initialized():
            return False
        return self._run("pg_ctl", "status", "-D", str(self.data), check=False).returncode == 0

    def init(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        _chown_for_server(self.directory)
        _chown_for_server(self.socket_dir)
        self._run("initdb", "-D", str(self.data), "-U", DB_USER, "--auth=trust", "-E", "UTF8",
                  "--locale=C.UTF-8" if _has_c_utf8() else "--locale=C")
        conf = [
            f"port = {self.port}",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.socket_dir.resolve()}'",
            "max_connections = 300",
            "shared_buffers = 256MB",
            "log_min_messages = warning",
        ]
        if not self.durable:
            conf += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        with open(self.data / "postgresql.conf", "a") as f:
            f.write("\n# valka local cluster\n" + "\n".join(conf) + "\n")

    def start(self) -> None:
        if not self.initialized():
            self.init()
        if self.running():
            return
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        _chown_for_server(self.socket_dir)
        log = self.directory / "postgres.log"
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(log),
                  "-o", f"-p {self.port}")
        self._create_database()

    def stop(self, mode: str = "fast") -> None:
        if self.running():
            self._run("pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data))

    def remove_files(self) -> None:
        """Delete a stopped throwaway cluster: its folder, and its socket folder wherever it is."""
        shutil.rmtree(self.directory, ignore_errors=True)
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def _create_database(self) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(
                    f"postgres://{DB_USER}@127.0.0.1:{self.port}/postgres", autocommit=True
                ) as conn:
                    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone()
                    if not exists:
                        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def _has_c_utf8() -> bool:
    out = subprocess.run(["locale", "-a"], capture_output=True, text=True)
    return any(line.lower() in ("c.utf8", "c.utf-8") for line in out.stdout.splitlines())


def exec_with_database(cmd: list[str], temp: bool, directory: str, port: int) -> int:
    """Run `cmd` with DATABASE_URL pointing at a cluster (unless one is already given), as part of
    a local stack (VALKA_DEVELOPMENT: its servers may run with the development SECRET_KEY)."""
    if os.environ.get("DATABASE_URL"):
        return subprocess.call(cmd, env=dict(os.environ, VALKA_DEVELOPMENT=os.environ.get("VALKA_DEVELOPMENT", "true")))
    if temp:
        cluster = Cluster(Path(tempfile.mkdtemp(prefix="valka-test-pg-")), free_port(), durable=False)
    else:
        cluster = Cluster(Path(directory), port)
    try:
        cluster.start()
        env = dict(os.environ, DATABASE_URL=cluster.url, VALKA_DEVDB_DIR=str(cluster.directory))
        env.setdefault("VALKA_DEVELOPMENT", "true")
        return subprocess.call(cmd, env=env)
    finally:
        if temp:
            try:
                cluster.stop("immediate")
            finally:
                cluster.remove_files()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m valka.devdb")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("start", "stop", "status"):
        p = sub.add_parser(name)
        p.add_argument("--dir", default=DEFAULT_DIR)
        p.add_argument("--port", type=int, default=int(os.environ.get("VALKA_PG_PORT", DEFAULT_PORT)))
    p = sub.add_parser("exec")
    p.add_argument("--temp", action="store_true", help="a throwaway cluster, removed afterwards")
    p.add_argument("--dir", default=DEFAULT_DIR)
    p.add_argument("--port", type=int, default=int(os.environ.get("VALKA_PG_PORT", DEFAULT_PORT)))
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.command == "exec":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            return exec_with_database(cmd, args.temp, args.dir, args.port)
        cluster = Cluster(Path(args.dir), args.port)
        if args.command == "start":
            cluster.start()
            print(cluster.url)
        elif args.command == "stop":
            cluster.stop()
        else:
            print("running" if cluster.running() else "stopped")
        return 0
    except DevDBError as exc:
        print(f"valka.devdb: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
