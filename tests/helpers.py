"""Every helper the tests share, defined once; fixtures are in tests/conftest.py.

- the test database: `database_url`, `no_event_watchers_left`, `db_now`
- waiting: `wait_for`, and `status_of` / `wait_status` for a task's status
- the REST API's error shape: `assert_error`
- the real stack as processes (dispatcher, scheduler, web, SDK workers): `Stack`, and an OTLP
  collector for the spans they export: `Collector`
- hand-written gRPC worker sessions: `hello`, `Feeder`, `Raw`
- the scheduler's loops run once on their own connections: `make_config`, `connect`, `once`,
  `run_async`, and a LISTEN connection: `Listener`

The scheduler's loops run on their own psycopg connections, so the rows a test builds
with the factories must be committed: such tests use `django_db(transaction=True)`.
ORM calls stay outside `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import psycopg
from django.db import connection
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from psycopg import pq

from tasks.models import Task
from tasks.retry import RetryPolicy
from tasks.scheduler.base import Loop, SchedulerConfig
from valka.db import conninfo
from valka.devdb import free_port, wait_for
from valka.devdb import listening as _listening
from valka_sdk.v1 import worker_pb2 as pb
from valka_sdk.v1 import worker_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024


# -- The test database. --

def database_url() -> str:
    """A libpq URL for the database the test run uses (the test database)."""
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgresql://{auth}@{s['HOST'] or 'localhost'}:{s['PORT'] or 5432}/{s['NAME']}"


def no_event_watchers_left(timeout: float = 10.0) -> None:
    """Wait until no session watches task events: earlier tests' watchers are pruned once their
    sessions have ended, a moment after they close."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cur:
        while True:
            cur.execute("SELECT valka_task_event_watchers_prune()")
            cur.execute("SELECT count(*) FROM task_event_watchers")
            if cur.fetchone()[0] == 0:
                return
            assert time.monotonic() < deadline, "a task event watcher from an earlier test is still alive"
            time.sleep(0.05)


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


# -- Waiting. --

def status_of(task_id) -> str:
    return Task.objects.values_list("status", flat=True).get(id=task_id)


def wait_status(task_id, *statuses, timeout=45.0):
    wait_for(lambda: status_of(task_id) in statuses, timeout, what=f"task {task_id} in {statuses}")
    return Task.objects.get(id=task_id)


# -- The REST API. --

def assert_error(response, status, code, field=None):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error", "message", "details"}
    assert body["error"] == code
    if field:
        assert field in body["details"], body
        assert field in body["message"]


def query(cluster: Any, sql: str, *params: Any) -> list[tuple]:
    """Rows of `sql` on a cluster of a test's own (the `own_cluster` fixture), not the test database."""
    with psycopg.connect(cluster.url, autocommit=True, connect_timeout=5) as conn:
        return conn.execute(sql, params).fetchall()


# -- The real stack, as processes talking gRPC over loopback to each other and to the test database. --

class Stack:
    """Starts processes against the test database (or `url`'s); stops them all at teardown."""

    def __init__(self, tmp_path: Path, url: str | None = None) -> None:
        self.tmp = tmp_path
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, DATABASE_URL=url or database_url(), PYTHONUNBUFFERED="1",
                        VALKA_DISPATCH_POLL_INTERVAL="1", VALKA_LOG_LEVEL="INFO",
                        VALKA_DB_POOL="false", VALKA_API_ANONYMOUS="true", VALKA_DEVELOPMENT="true")

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

    def django_worker(self, *args: str, name: str = "django", **env: str) -> subprocess.Popen:
        """`manage.py valka_worker` of the test Django project (tests/django_project), with `args`;
        `env` gives it VALKA_URL, VALKA_DISPATCHER, SHOP_DB and SHOP_MARKS."""
        return self._spawn([sys.executable, "-m", "django", "valka_worker", "--name", name, *args],
                           f"django-worker-{name}",
                           {**self.env, "DJANGO_SETTINGS_MODULE": "tests.django_project.settings", **env})

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


def has_scheduler() -> bool:
    return (ROOT / "tasks/management/commands/run_scheduler.py").exists()


# -- Hand-written gRPC worker sessions. --

def hello(queues=("raw",), worker_id="", concurrency=1, name="raw", metadata=""):
    return pb.WorkerRequest(hello=pb.WorkerHello(worker_id=worker_id, worker_name=name, queues=list(queues),
                                                 concurrency=concurrency, metadata=metadata))


class Feeder:
    """A request iterator the test can append to and close."""

    def __init__(self, first):
        self.q: queue.Queue = queue.Queue()
        for item in first:
            self.q.put(item)

    def put(self, item):
        self.q.put(item)

    def close(self):
        self.q.put(None)

    def __iter__(self):
        return self

    def __next__(self):
        item = self.q.get()
        if item is None:
            raise StopIteration
        return item


class Raw:
    """A hand-written worker session on its own channel."""

    def __init__(self, addr: str, first: list, metadata=None) -> None:
        self.channel = grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 * MiB),
                                                            ("grpc.max_receive_message_length", 64 * MiB)])
        self.feeder = Feeder(first)
        self.call = worker_pb2_grpc.WorkerServiceStub(self.channel).Session(self.feeder, metadata=metadata)

    def send(self, **message) -> None:
        self.feeder.put(pb.WorkerRequest(**message))

    def next(self, kind: str):
        """The next response of `kind`, skipping others."""
        while True:
            response = next(self.call)
            if response.WhichOneof("response") == kind:
                return getattr(response, kind)

    def ack(self) -> None:
        """A heartbeat round trip: everything sent before it has been read by the dispatcher."""
        self.send(heartbeat=pb.Heartbeat())
        self.next("heartbeat_ack")

    def close(self) -> None:
        self.feeder.close()
        self.call.cancel()
        self.channel.close()


# -- Spans the stack's processes export. --

class Collector:
    """An OTLP/gRPC trace collector on a free loopback port: processes given `env` export their
    spans here (valka_sdk.tracing.configure reads the standard variables), and `spans()` returns
    them as `dict`s: name, service, trace_id, span_id, parent_id (hex, "" for a root), kind,
    status ("UNSET", "OK", "ERROR"), attributes, events [(name, attributes)], links [(trace_id,
    span_id, attributes)]."""

    def __init__(self) -> None:
        received: list[Any] = []

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802
                received.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self.received = received
        self.server = grpc.server(ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_TRACES_EXPORTER": "otlp",
                    "OTEL_BSP_SCHEDULE_DELAY": "100"}

    def spans(self) -> list[dict[str, Any]]:
        def value(v: Any) -> Any:
            kind = v.WhichOneof("value")
            return list(map(value, v.array_value.values)) if kind == "array_value" else getattr(v, kind)

        def attributes(kvs: Any) -> dict[str, Any]:
            return {kv.key: value(kv.value) for kv in kvs}

        found = []
        for request in list(self.received):
            for resource_spans in request.resource_spans:
                service = attributes(resource_spans.resource.attributes).get("service.name")
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        found.append({
                            "name": span.name, "service": service, "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(), "parent_id": span.parent_span_id.hex(),
                            "kind": trace_pb2.Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                            "status": trace_pb2.Status.StatusCode.Name(span.status.code).removeprefix("STATUS_CODE_"),
                            "attributes": attributes(span.attributes),
                            "events": [(e.name, attributes(e.attributes)) for e in span.events],
                            "links": [(link.trace_id.hex(), link.span_id.hex(), attributes(link.attributes))
                                      for link in span.links]})
        return found

    def wait(self, predicate: Callable[[list[dict[str, Any]]], Any], what: str, timeout: float = 30.0) -> Any:
        """The first true answer of `predicate(spans())`, waiting for the processes' exports."""
        return wait_for(lambda: predicate(self.spans()), timeout, what=what)

    def stop(self) -> None:
        self.server.stop(None)


# -- The scheduler's loops, one pass at a time, on their own connections. --

def make_config(**overrides: Any) -> SchedulerConfig:
    values: dict[str, Any] = {
        "batch_size": 500, "max_sleep": 1.0, "reaper_interval": 30.0, "dispatching_timeout": 60.0,
        "worker_timeout": 120.0, "retention_interval": 600.0, "retention_days": 7.0,
        "dead_letter_retention_days": 30.0,
        "retry_params": RetryPolicy(base_delay=1.0, max_delay=3600.0, jitter=0.25).sql_params(),
    }
    values.update(overrides)
    return SchedulerConfig(**values)


async def connect(name: str = "valka-tests") -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(conninfo(application_name=name), autocommit=True)


def once(loop: Loop, now: datetime | None = None) -> int:
    """One `run_once` of `loop` on a fresh connection."""

    async def go() -> int:
        async with await connect() as conn:
            return await loop.run_once(conn, now)

    return asyncio.run(go())


def pass_and_sleep(loop: Loop) -> tuple[float, int]:
    """One `run_once` of `loop` and its `next_delay`, on a fresh connection: the delay, and how many
    requests they sent PostgreSQL, read from libpq's trace of the connection (each extended-protocol
    statement ends with a Sync, each simple one, as BEGIN and COMMIT are, is a Query)."""

    async def go() -> tuple[float, list[str]]:
        async with await connect() as conn:
            with tempfile.TemporaryFile() as trace:
                conn.pgconn.trace(trace.fileno())
                conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
                try:
                    await loop.run_once(conn)
                    delay = await loop.next_delay(conn)
                finally:
                    conn.pgconn.untrace()
                trace.seek(0)
                return delay, trace.read().decode(errors="replace").splitlines()

    delay, lines = asyncio.run(go())
    sent = [line.split("\t") for line in lines if line.startswith("F")]
    return delay, sum(1 for fields in sent if len(fields) > 2 and fields[2] in ("Sync", "Query"))


def run_async(fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(fn())


class Listener:
    """A separate connection LISTENing on a channel; `drain()` returns the payloads it received."""

    def __init__(self, channel: str) -> None:
        self.conn = psycopg.connect(database_url(), autocommit=True)
        self.conn.execute(f"LISTEN {channel}")

    def drain(self, expect: int, timeout: float = 10.0) -> list[str]:
        """The payloads received: `expect` of them (waiting up to `timeout`), plus any
        that arrive within a short grace period after, so extra ones are seen too."""
        got = [n.payload for n in self.conn.notifies(timeout=timeout, stop_after=expect)] if expect else []
        return got + [n.payload for n in self.conn.notifies(timeout=0.2)]

    def close(self) -> None:
        self.conn.close()
