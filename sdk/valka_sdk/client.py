"""A producer's client for the REST API, sync (`Client`) and async (`AsyncClient`).

    client = Client("http://127.0.0.1:8989", api_key="vk_...")
    task = client.create_task("send_email", queue="emails", input={"to": "ada@example.com"})
    client.get_task(task["id"])["status"]

Creating tasks sends the current span's W3C trace context (`traceparent`), which the server stores
on the tasks (valka_sdk.tracing): their runs join the caller's trace.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import httpx

from valka_sdk import tracing
from valka_sdk.errors import ValkaAPIError


def _task_body(task_name: str, queue: str, input: Any, priority: int | None, max_retries: int | None,
               timeout_seconds: int | None, idempotency_key: str | None, metadata: dict[str, Any] | None,
               run_at: datetime | str | None, id: uuid.UUID | str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"task_name": task_name, "queue": queue, "input": input}
    optional = {"priority": priority, "max_retries": max_retries, "timeout_seconds": timeout_seconds,
                "idempotency_key": idempotency_key, "metadata": metadata,
                "run_at": run_at.isoformat() if isinstance(run_at, datetime) else run_at,
                "id": None if id is None else str(id)}
    body.update({k: v for k, v in optional.items() if v is not None})
    return body


def _answer(response: httpx.Response) -> Any:
    if response.status_code == 204:
        return None
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.is_error:
        if isinstance(data, dict) and "error" in data:
            raise ValkaAPIError(response.status_code, data["error"], data.get("message", ""), data.get("details"))
        raise ValkaAPIError(response.status_code, "ERROR", response.text[:500])
    return data


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _clean(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


class Client:
    def __init__(self, base_url: str = "http://127.0.0.1:8989", *, api_key: str | None = None,
                 timeout: float = 30.0) -> None:
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=_headers(api_key), timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_task(self, task_name: str, *, queue: str = "default", input: Any = None, priority: int | None = None,
                    max_retries: int | None = None, timeout_seconds: int | None = None,
                    idempotency_key: str | None = None, metadata: dict[str, Any] | None = None,
                    run_at: datetime | str | None = None, id: uuid.UUID | str | None = None) -> dict[str, Any]:
        """POST /api/v1/tasks. With an `id` of your own (`valka_sdk.ids.uuid7()`), a repeat of the
        call answers the task the first one made: safe to retry after a lost answer."""
        body = _task_body(task_name, queue, input, priority, max_retries, timeout_seconds, idempotency_key,
                          metadata, run_at, id)
        return _answer(self._http.post("/api/v1/tasks", json=body, headers=tracing.headers()))

    def create_tasks(self, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Create up to 1,000 tasks in one call; each result in order (see `POST /api/v1/tasks/batch`)."""
        return _answer(self._http.post("/api/v1/tasks/batch", json={"tasks": tasks},
                                       headers=tracing.headers()))["results"]

    def get_task(self, task_id: str) -> dict[str, Any]:
        return _answer(self._http.get(f"/api/v1/tasks/{task_id}"))

    def list_tasks(self, *, queue: str | None = None, status: str | None = None, task_name: str | None = None,
                   limit: int = 50, offset: int = 0) -> dict[str, Any]:
        params = _clean({"queue": queue, "status": status, "task_name": task_name, "limit": limit, "offset": offset})
        return _answer(self._http.get("/api/v1/tasks", params=params))

    def list_task_runs(self, task_id: str) -> list[dict[str, Any]]:
        """Every run of the task, by attempt (all pages of `GET /api/v1/tasks/{id}/runs`)."""
        runs: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 1000}
        while True:
            page = _answer(self._http.get(f"/api/v1/tasks/{task_id}/runs", params=params))
            runs.extend(page["results"])
            if not page.get("has_more") or not page.get("next_cursor"):
                return runs
            params = {"limit": 1000, "cursor": page["next_cursor"]}

    def cancel_task(self, task_id: str) -> dict[str, Any]:
        return _answer(self._http.post(f"/api/v1/tasks/{task_id}/cancel"))

    def send_signal(self, task_id: str, signal_type: str, payload: Any = None) -> dict[str, Any]:
        return _answer(self._http.post(f"/api/v1/tasks/{task_id}/signal",
                                       json={"signal_type": signal_type, "payload": payload}))


class AsyncClient:
    def __init__(self, base_url: str = "http://127.0.0.1:8989", *, api_key: str | None = None,
                 timeout: float = 30.0) -> None:
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=_headers(api_key), timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def create_task(self, task_name: str, *, queue: str = "default", input: Any = None,
                          priority: int | None = None, max_retries: int | None = None,
                          timeout_seconds: int | None = None, idempotency_key: str | None = None,
                          metadata: dict[str, Any] | None = None,
                          run_at: datetime | str | None = None,
                          id: uuid.UUID | str | None = None) -> dict[str, Any]:
        body = _task_body(task_name, queue, input, priority, max_retries, timeout_seconds, idempotency_key,
                          metadata, run_at, id)
        return _answer(await self._http.post("/api/v1/tasks", json=body, headers=tracing.headers()))

    async def create_tasks(self, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _answer(await self._http.post("/api/v1/tasks/batch", json={"tasks": tasks},
                                             headers=tracing.headers()))["results"]

    async def get_task(self, task_id: str) -> dict[str, Any]:
        return _answer(await self._http.get(f"/api/v1/tasks/{task_id}"))

    async def list_tasks(self, *, queue: str | None = None, status: str | None = None,
                         task_name: str | None = None, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        params = _clean({"queue": queue, "status": status, "task_name": task_name, "limit": limit, "offset": offset})
        return _answer(await self._http.get("/api/v1/tasks", params=params))

    async def cancel_task(self, task_id: str) -> dict[str, Any]:
        return _answer(await self._http.post(f"/api/v1/tasks/{task_id}/cancel"))

    async def send_signal(self, task_id: str, signal_type: str, payload: Any = None) -> dict[str, Any]:
        return _answer(await self._http.post(f"/api/v1/tasks/{task_id}/signal",
                                             json={"signal_type": signal_type, "payload": payload}))
