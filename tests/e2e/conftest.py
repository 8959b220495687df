"""The real stack for end-to-end tests: dispatcher, scheduler and SDK workers as processes,
talking gRPC over loopback to each other and to the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

from valka.devdb import free_port
from valka.devdb import listening as _listening

ROOT = Path(__file__).resolve().parents[2]




def test_database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or 'localhost'}:{s['PORT'] or 5432}/{s['NAME']}"


def wait_for(predicate: Callable[[], object], timeout: float = 45.0, interval: float = 0.05, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


class Stack:
    """Starts processes against the test database; stops them all at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, DATABASE_URL=test_database_url(), PYTHONUNBUFFERED="1",
                        VALKA_DISPATCH_POLL_INTERVAL="1", VALKA_LOG_LEVEL="INFO",
                        VALKA_DB_POOL="false", VALKA_API_ANONYMOUS="true")

    def _spawn(self, cmd: list[str], name: str, env: dict[str, str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        proc.log_path = self.tmp / f"{name}.log"  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def dispatcher(self, port: int | None = None, **env: str) -> tuple[subprocess.Popen, str]:
        port = port or free_port()
        addr = f"127.0.0.1:{port}"
        proc = self._spawn([sys.executable, "manage.py", "run_dispatcher", "--addr", addr],
                           f"dispatcher-{port}", {**self.env, **env})
        wait_for(lambda: _listening(port) or proc.poll() is not None, 20, what=f"dispatcher on {addr}")
        assert proc.poll() is None, (self.tmp / f"dispatcher-{port}.log").read_text()
        return proc, addr

    def web(self, **env: str) -> str:
        port = free_port()
        proc = self._spawn([sys.executable, "-m", "uvicorn", "valka.asgi:application", "--host", "127.0.0.1",
                            "--port", str(port), "--no-access-log"], f"web-{port}",
                           {**self.env, "VALKA_API_ANONYMOUS": "true", **env})
        wait_for(lambda: _listening(port) or proc.poll() is not None, 30, what="web app")
        assert proc.poll() is None, (self.tmp / f"web-{port}.log").read_text()
        return f"http://127.0.0.1:{port}"

    def scheduler(self, **env: str) -> subprocess.Popen:
        return self._spawn([sys.executable, "manage.py", "run_scheduler"], f"scheduler-{len(self.procs)}",
                           {**self.env, **env})

    def worker(self, server: str, *, queues: str = "default", concurrency: int = 4, name: str = "w",
               heartbeat: float = 30.0, **env: str) -> subprocess.Popen:
        return self._spawn([sys.executable, "-m", "tests.e2e.worker_app"], f"worker-{name}", {
            **self.env, "VALKA_TEST_SERVER": server, "VALKA_TEST_QUEUES": queues,
            "VALKA_TEST_CONCURRENCY": str(concurrency), "VALKA_TEST_NAME": name,
            "VALKA_TEST_HEARTBEAT": str(heartbeat), **env,
        })

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            proc.wait(10)

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log_path.read_text()[-3000:]}" for p in self.procs)  # type: ignore


@pytest.fixture
def stack(transactional_db, tmp_path, request):
    s = Stack(tmp_path)
    yield s
    s.stop_all()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(s.logs())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report
