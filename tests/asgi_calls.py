"""Requests driven through the ASGI entry (valka.asgi) with hand-made scope, receive and send."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from valka import asgi

URL = "/api/v1/tasks"
CHUNK = 64 * 1024


class Request:
    """One request's client side: `receive` hands out the body in CHUNK-sized messages and counts
    what it handed out; `send` keeps the response."""

    def __init__(self, size: int | None = None, body: bytes | None = None) -> None:
        self.body = body
        self.size = len(body) if body is not None else size or 0
        self.handed = 0  # body bytes given to the app
        self.calls = 0  # receive() calls
        self.messages: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.calls += 1
        if self.handed >= self.size and self.calls > 1:
            return {"type": "http.disconnect"}  # asked again once the body is all out: the client is gone
        n = min(CHUNK, self.size - self.handed)
        chunk = self.body[self.handed:self.handed + n] if self.body is not None else b"x" * n
        self.handed += n
        return {"type": "http.request", "body": chunk, "more_body": self.handed < self.size}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return self.messages[0]["status"]

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])

    def json(self) -> dict[str, Any]:
        return json.loads(b"".join(m.get("body", b"") for m in self.messages[1:]))


def call(request: Request, path: str = URL, *, method: str = "POST", headers: dict[str, str] | None = None,
         announce: bool = True, app: Any = None, query: bytes = b"") -> Request:
    """Run one request through the app. `announce`: a Content-Length, else a chunked body."""
    sent = [(b"host", b"testserver"), (b"content-type", b"application/json")]
    if request.size:
        sent.append((b"content-length", str(request.size).encode()) if announce
                    else (b"transfer-encoding", b"chunked"))
    given = {name.lower().encode(): value.encode() for name, value in (headers or {}).items()}
    sent = [(name, value) for name, value in sent if name not in given] + list(given.items())
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
        "root_path": "", "headers": sent, "client": ("127.0.0.1", 40000), "server": ("testserver", 80),
    }
    asyncio.run((app or asgi.application)(scope, request.receive, request.send))
    return request


def assert_api_error(request: Request, status: int, code: str) -> dict[str, Any]:
    assert request.status == status, request.messages
    assert request.headers[b"content-type"] == b"application/json"
    body = request.json()
    assert set(body) == {"error", "message", "details"} and body["error"] == code
    return body


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
