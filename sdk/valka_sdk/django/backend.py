"""`ValkaBackend`: Django's task API (`django.tasks`) with Valka underneath.

`Task.enqueue()` creates one Valka task: `task_name` is the function's dotted path, `queue` the
task's `queue_name`, `priority` Django's (−100…100, higher first), `run_after` its `run_at`, and
`{"args": [...], "kwargs": {...}}` its input. The `TaskResult`'s id is the Valka task's id, a
UUIDv7 made here, so it is known at once, even before the task is sent.

Two modes, by `OPTIONS` (`valka_sdk.django.options`):

- remote (`URL` set): `POST /api/v1/tasks` with the id. Inside `transaction.atomic()` the task
  is sent when the transaction commits (`transaction.on_commit`), and never if it rolls back.
  A send that does not reach the server is tried again (`RETRIES`): a repeat of the id answers
  the task the first try made, so no try makes a second task. The send carries the trace context
  of the `enqueue()` call (`traceparent`), even from `on_commit`.
- in process (no `URL`, inside Valka's own project): `valka.enqueue`, in the caller's
  transaction (the task commits with the caller's rows or not at all).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC
from functools import partial
from typing import Any

import httpx
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued

from valka_sdk import tracing
from valka_sdk.client import Client
from valka_sdk.django import options as options_module
from valka_sdk.django import results
from valka_sdk.errors import ValkaAPIError, ValkaUnavailable
from valka_sdk.ids import uuid7
from valka_sdk.limits import MAX_NAME, MAX_RETRIES_LIMIT, QUEUE_RE, QUEUE_RULE, TIMEOUT_RANGE

# Statuses of a failed REST create that a later try may get past; the rest are answers.
_TRY_AGAIN = {502, 503, 504}


@dataclass(frozen=True, slots=True, kw_only=True)
class ValkaTask(Task):
    """A `@task` with Valka's own options, given to `@task(...)` or per call with `.using(...)`.

    None leaves the server's default (`VALKA_MAX_RETRIES`, `VALKA_DEFAULT_TIMEOUT_SECONDS`).
    """

    max_retries: int | None = None  # retries after the first attempt
    timeout_seconds: int | None = None  # the lease per attempt
    idempotency_key: str | None = None  # an enqueue whose key exists answers the key's task
    metadata: dict[str, Any] | None = field(default=None, hash=False)  # a JSON object, shown in the admin

    def using(self, *, priority: int | None = None, queue_name: str | None = None, run_after: Any = None,
              backend: str | None = None, max_retries: int | None = None, timeout_seconds: int | None = None,
              idempotency_key: str | None = None, metadata: dict[str, Any] | None = None) -> ValkaTask:
        task = Task.using(self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend)
        valka = {"max_retries": max_retries, "timeout_seconds": timeout_seconds,
                 "idempotency_key": idempotency_key, "metadata": metadata}
        changes = {name: value for name, value in valka.items() if value is not None}
        return replace(task, **changes) if changes else task


def _in_valka_project() -> bool:
    """Whether this is Valka's own project (its `tasks` app and the `valka` package, whose import
    costs nothing), where the backend may enqueue in process. A project's own app named `tasks`
    comes without `valka.enqueue`: valka-sdk does not bring the server."""
    if not any(app == "tasks" or app.startswith("tasks.") for app in settings.INSTALLED_APPS):
        return False
    try:
        import valka
    except ImportError:
        return False
    return callable(getattr(valka, "enqueue", None))


class ValkaBackend(BaseTaskBackend):
    task_class = ValkaTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.settings = options_module.read(alias, dict(self.options), self.queues,
                                            in_project=not self.options.get("URL") and _in_valka_project())
        self._client: Client | None = None

    # -- checks and validation --
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        return [checks.Error(message, hint=hint or None, id=check_id)
                for check_id, message, hint in self.settings.problems]

    def _ready(self) -> None:
        if self.settings.problems:
            _, message, hint = self.settings.problems[0]
            raise ImproperlyConfigured(f"{message} {hint}".strip())

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if not QUEUE_RE.match(task.queue_name) or len(task.queue_name) > MAX_NAME:
            raise InvalidTask(f"Queue {task.queue_name!r} is not a valid Valka queue: a name {QUEUE_RULE}.")
        if len(task.module_path) > MAX_NAME:
            raise InvalidTask(f"The task's path is longer than {MAX_NAME} characters.")
        if task.run_after is not None:
            try:
                task.run_after.astimezone(UTC)
            except (OverflowError, ValueError):
                raise InvalidTask("run_after must fall within the years 1 to 9999 in UTC.") from None
        if isinstance(task, ValkaTask):
            _check_int("max_retries", task.max_retries, 0, MAX_RETRIES_LIMIT)
            _check_int("timeout_seconds", task.timeout_seconds, *TIMEOUT_RANGE)
            if task.idempotency_key is not None and (not isinstance(task.idempotency_key, str)
                                                     or not 0 < len(task.idempotency_key) <= MAX_NAME
                                                     or "\x00" in task.idempotency_key):
                raise InvalidTask(f"idempotency_key must be a string of 1 to {MAX_NAME} characters.")
            if task.metadata is not None:
                if not isinstance(task.metadata, dict):
                    raise InvalidTask("metadata must be a dict (a JSON object).")
                _json("metadata", task.metadata)

    # -- enqueue --
    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        self._ready()
        try:
            result = TaskResult(task=task, id=str(uuid7()), status=TaskResultStatus.READY, enqueued_at=None,
                                started_at=None, finished_at=None, last_attempted_at=None, args=list(args),
                                kwargs=dict(kwargs), backend=self.alias, errors=[], worker_ids=[])
        except (TypeError, ValueError) as exc:
            raise InvalidTask(f"The task's arguments must be JSON: {exc}") from None
        body = self._body(task, result)
        if self.settings.url is None:
            self._create_in_process(result, body)
        elif self.settings.on_commit and transaction.get_connection(self.settings.database).in_atomic_block:
            send = partial(self._create_remote, result, body)
            if (traced := tracing.current()) is not None:  # the send at the commit joins this call's trace
                send = partial(tracing.run_in, traced, send)
            transaction.on_commit(send, using=self.settings.database, robust=self.settings.on_commit_robust)
        else:
            self._create_remote(result, body)
        return result

    def _body(self, task: Task, result: TaskResult) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": result.id, "task_name": task.module_path, "queue": task.queue_name, "priority": task.priority,
            "input": {"args": result.args, "kwargs": result.kwargs},
            "run_at": task.run_after.isoformat() if task.run_after is not None else None,
        }
        _json("args", body["input"])
        if isinstance(task, ValkaTask):
            body.update(max_retries=task.max_retries, timeout_seconds=task.timeout_seconds,
                        idempotency_key=task.idempotency_key, metadata=task.metadata)
        return body

    def _create_in_process(self, result: TaskResult, body: dict[str, Any]) -> None:
        import valka  # Valka's own project only (options: no URL)

        try:
            row = valka.enqueue(**{k: v for k, v in body.items() if v is not None})
        except Exception as exc:
            if getattr(exc, "code", None) in ("VALIDATION_ERROR", "PAYLOAD_TOO_LARGE"):
                raise InvalidTask(str(exc)) from exc
            raise
        self._created(result, str(row.id), row.created_at)

    def _create_remote(self, result: TaskResult, body: dict[str, Any]) -> None:
        """POST the task, trying again when it may not have arrived: the id makes a repeat harmless."""
        client = self._rest()
        url = self.settings.url
        for attempt in range(1, self.settings.retries + 1):
            try:
                task = client.create_task(**{k: v for k, v in body.items() if v is not None})
                break
            except ValkaAPIError as exc:
                if exc.status in (400, 413):
                    raise InvalidTask(f"Valka refused the task: {exc.message}") from exc
                if exc.status not in _TRY_AGAIN or attempt == self.settings.retries:
                    raise
            except httpx.TransportError as exc:
                if attempt == self.settings.retries:
                    raise ValkaUnavailable(f"could not enqueue {body['task_name']} (id {result.id}): Valka's API "
                                           f"at {url} is unreachable: {type(exc).__name__}: {exc}") from exc
            time.sleep(0.1 * 4 ** (attempt - 1))  # 0.1 s, 0.4 s, ...
        self._created(result, task["id"], results.parse_time(task["created_at"]))

    def _created(self, result: TaskResult, task_id: str, created_at: Any) -> None:
        if task_id != result.id:  # its idempotency key existed: the result is that task's
            object.__setattr__(result, "id", task_id)
        object.__setattr__(result, "enqueued_at", created_at)
        task_enqueued.send(type(self), task_result=result)

    def _rest(self) -> Client:
        if self._client is None:
            self._client = Client(self.settings.url or "", api_key=self.settings.api_key,
                                  timeout=self.settings.timeout)
        return self._client

    # -- results --
    def get_result(self, result_id: str) -> TaskResult:
        self._ready()
        try:
            task_id = str(uuid.UUID(str(result_id)))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        if self.settings.url is None:
            import valka

            try:
                task, runs = valka.get_task(task_id), valka.list_task_runs(task_id)
            except Exception as exc:
                if getattr(exc, "code", None) == "NOT_FOUND":
                    raise TaskResultDoesNotExist(result_id) from None
                raise
        else:
            try:
                task, runs = self._rest().get_task(task_id), self._rest().list_task_runs(task_id)
            except ValkaAPIError as exc:
                if exc.status == 404:
                    raise TaskResultDoesNotExist(result_id) from None
                raise
            except httpx.TransportError as exc:
                raise ValkaUnavailable(f"Valka's API at {self.settings.url} is unreachable: {exc}") from exc
        return results.task_result(self, task, runs)


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi):
        raise InvalidTask(f"{name} must be a whole number between {lo} and {hi}.")


def _json(name: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidTask(f"The task's {name} must be JSON: {exc}") from None


__all__ = ["ValkaBackend", "ValkaTask"]
