"""The Django worker: `manage.py valka_worker` runs the project's `@task` functions from Valka.

A Valka task whose `task_name` is a dotted path to a `@task` (what `ValkaBackend` enqueues) runs
that function with the input's `args` and `kwargs`. The SDK's `Worker` does the rest (the stream,
heartbeats, retries, cancellation, logs, graceful shutdown); this module is its resolver:

- the path is imported on first use and kept; one that does not import, or is no `@task`,
  fails the task for good, saying which;
- sync functions run in the worker's threads, with `close_old_connections()` before and after,
  as Django's request cycle does; a cancel raises `TaskCancelled` in their thread (at the next
  Python instruction); async functions run on the event loop, and a cancel stops them at their
  next `await`;
- `takes_context` functions get a `ValkaTaskContext`: Django's `TaskContext`, whose `attempt`
  (and its `task_result.attempts`) is Valka's attempt, with the SDK's context as `.valka`
  (`log()`, `cancelled`, signals);
- Django's `task_started` and `task_finished` signals are sent around each run;
- a return value that is not JSON fails the run for good, saying why;
- Python `logging` inside a task goes to the run's log too.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
from django.db import close_old_connections, connections
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTaskBackend
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from valka_sdk import Worker
from valka_sdk.context import TaskContext as ValkaContext
from valka_sdk.django.backend import ValkaBackend
from valka_sdk.errors import NonRetryableError, TaskCancelled, class_path
from valka_sdk.worker import Handler


@dataclass(frozen=True, slots=True, kw_only=True)
class ValkaTaskContext(TaskContext):
    """What a `takes_context` task gets: Django's `TaskContext`, and Valka's run as `.valka`."""

    valka: ValkaContext

    @property
    def attempt(self) -> int:
        return self.valka.attempt


class RunningTaskResult(TaskResult):
    """The `TaskResult` of the run under way, as its signals and a `takes_context` function see it.
    Django counts `attempts` from `worker_ids`, and a worker knows only its own id: Valka's attempt
    number says how many runs there have been, this one included."""

    __slots__ = ("_attempt",)

    @property
    def attempts(self) -> int:
        return getattr(self, "_attempt", None) or len(self.worker_ids)


def _enqueued_at(task_id: str) -> datetime | None:
    """A UUIDv7's time (the backend makes the ids when it enqueues), or None for another kind."""
    import uuid

    try:
        parsed = uuid.UUID(task_id)
    except ValueError:
        return None
    return datetime.fromtimestamp((parsed.int >> 80) / 1000, UTC) if parsed.version == 7 else None


def _arguments(ctx: ValkaContext) -> tuple[list[Any], dict[str, Any]]:
    """The input's args and kwargs (a task made by another producer with no input takes none)."""
    data = {} if ctx.input is None else ctx.input
    if not isinstance(data, dict) or not isinstance(data.get("args", []), list) \
            or not isinstance(data.get("kwargs", {}), dict):
        raise NonRetryableError(f"task {ctx.task_name!r}: its input must be {{\"args\": [...], \"kwargs\": {{...}}}}")
    return data.get("args", []), data.get("kwargs", {})


class DjangoTasks:
    """The worker's resolver: a handler for each task name that is the dotted path of a `@task`."""

    def __init__(self, backend_alias: str, worker_id: Callable[[], str]) -> None:
        self.backend_alias = backend_alias
        self.sender = type(task_backends[backend_alias])
        self.worker_id = worker_id

    def __call__(self, task_name: str) -> Handler:
        try:
            task = import_string(task_name)
        except ImportError as exc:
            raise NonRetryableError(f"task {task_name!r} is not importable: {exc}") from exc
        if not isinstance(task, Task):
            raise NonRetryableError(f"{task_name!r} is not a @task function (it is a {type(task).__name__})")
        if inspect.iscoroutinefunction(task.func):
            async def run_async(ctx: ValkaContext) -> Any:
                result, call = self._begin(task, ctx)
                await task_started.asend(sender=self.sender, task_result=result)
                try:
                    value = await call()
                except BaseException as exc:
                    await self._failed(result, exc, asynchronous=True)
                    raise
                return await self._succeeded(result, value, asynchronous=True)
            return run_async

        def run_sync(ctx: ValkaContext) -> Any:
            close_old_connections()
            try:
                result, call = self._begin(task, ctx)
                task_started.send(sender=self.sender, task_result=result)
                try:
                    value = call()
                except BaseException as exc:
                    self._failed(result, exc)
                    raise
                return self._succeeded(result, value)
            except TaskCancelled:
                for conn in connections.all(initialized_only=True):
                    conn.close()  # interrupted anywhere, maybe inside a transaction: start afresh
                raise
            finally:
                close_old_connections()
        return run_sync

    # -- one run --
    def _begin(self, task: Task, ctx: ValkaContext) -> tuple[TaskResult, Callable[[], Any]]:
        """The run's TaskResult (RUNNING) and the call of the function with its arguments."""
        args, kwargs = _arguments(ctx)
        now = datetime.now(UTC)
        result = RunningTaskResult(task=task, id=ctx.task_id, status=TaskResultStatus.RUNNING,
                                   enqueued_at=_enqueued_at(ctx.task_id), started_at=now, finished_at=None,
                                   last_attempted_at=now, args=args, kwargs=kwargs, backend=self.backend_alias,
                                   errors=[], worker_ids=[self.worker_id()])
        object.__setattr__(result, "_attempt", ctx.attempt)
        if task.takes_context:
            context = ValkaTaskContext(task_result=result, valka=ctx)
            return result, lambda: task.func(context, *args, **kwargs)
        return result, lambda: task.func(*args, **kwargs)

    def _failed(self, result: TaskResult, exc: BaseException, asynchronous: bool = False) -> Any:
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        object.__setattr__(result, "finished_at", datetime.now(UTC))
        result.errors.append(TaskError(exception_class_path=class_path(exc),
                                       traceback="".join(traceback.format_exception(exc))))
        if asynchronous:
            return task_finished.asend(sender=self.sender, task_result=result)
        task_finished.send(sender=self.sender, task_result=result)
        return None

    def _succeeded(self, result: TaskResult, value: Any, asynchronous: bool = False) -> Any:
        try:
            value = normalize_json(value)
        except (TypeError, ValueError) as exc:
            error = NonRetryableError(f"the task's return value is not JSON: {exc}")
            finishing = self._failed(result, error, asynchronous)
            if asynchronous:
                async def fail() -> Any:
                    await finishing
                    raise error
                return fail()
            raise error from None
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "finished_at", datetime.now(UTC))
        object.__setattr__(result, "_return_value", value)
        if asynchronous:
            async def finish() -> Any:
                await task_finished.asend(sender=self.sender, task_result=result)
                return value
            return finish()
        task_finished.send(sender=self.sender, task_result=result)
        return value


def tls_credentials(ca_file: str | None, cert_file: str | None, key_file: str | None,
                    system_roots: bool) -> grpc.ChannelCredentials | bool:
    """The worker's `tls`: a CA of its own (and, for mutual TLS, a certificate and key), the
    system's roots, or plaintext."""
    def pem(path: str | None) -> bytes | None:
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    if ca_file or cert_file:
        return grpc.ssl_channel_credentials(root_certificates=pem(ca_file), private_key=pem(key_file),
                                            certificate_chain=pem(cert_file))
    return bool(system_roots)


def build_worker(*, backend_alias: str = "default", queues: list[str] | None = None, concurrency: int = 8,
                 name: str | None = None, worker_id: str | None = None, dispatcher: str | None = None,
                 tls_ca_file: str | None = None, tls_cert_file: str | None = None,
                 tls_key_file: str | None = None, tls: bool | None = None) -> Worker:
    """A worker for the backend `backend_alias`'s queues (or `queues`), from its OPTIONS; the
    arguments given override them."""
    try:
        backend = task_backends[backend_alias]
    except InvalidTaskBackend as exc:
        raise ValueError(f"no task backend {backend_alias!r}: {exc}") from None
    if not isinstance(backend, ValkaBackend):
        raise ValueError(f"TASKS[{backend_alias!r}] is a {type(backend).__name__}, not a ValkaBackend: "
                         "its tasks do not go through Valka")
    options = backend.settings
    server = dispatcher or options.dispatcher
    if not server:
        raise ValueError(f"no dispatcher: set TASKS[{backend_alias!r}]['OPTIONS']['DISPATCHER'] or --dispatcher")
    worker: Worker | None = None
    resolver = DjangoTasks(backend_alias, lambda: worker.worker_id if worker else "")
    worker = Worker(
        server, queues=sorted(queues or backend.queues or ["default"]), concurrency=concurrency, name=name,
        worker_id=worker_id, token=options.worker_token, resolve=resolver,
        # Django's "Task id=... state=..." lines repeat what the run's status says.
        capture_logging=True, capture_logging_except=("django.tasks",), interrupt_sync_handlers=True,
        tls=tls_credentials(tls_ca_file or options.tls_ca_file, tls_cert_file or options.tls_cert_file,
                            tls_key_file or options.tls_key_file, tls if tls is not None else options.tls),
    )
    return worker
