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
    asyncio.run((app or asgi.application)(_scope(request, path, method=method, headers=headers, announce=announce,
                                                 query=query), request.receive, request.send))
    return request


def _scope(request: Request, path: str = URL, *, method: str = "POST", headers: dict[str, str] | None = None,
           announce: bool = True, query: bytes = b"") -> dict[str, Any]:
    sent = [(b"host", b"testserver"), (b"content-type", b"application/json")]
    if request.size:
        sent.append((b"content-length", str(request.size).encode()) if announce
                    else (b"transfer-encoding", b"chunked"))
    given = {name.lower().encode(): value.encode() for name, value in (headers or {}).items()}
    sent = [(name, value) for name, value in sent if name not in given] + list(given.items())
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
        "root_path": "", "headers": sent, "client": ("127.0.0.1", 40000), "server": ("testserver", 80),
    }


def served(*calls: tuple[Request, dict[str, Any]], app: Any = None) -> None:
    """Run requests through the app as a server runs it, one after the other on one event loop:
    its lifespan started first (it remembers API keys once it listens for their changes, and opens
    the connections REST creates use on the event loop), then ended. Each item is a request and
    `call`'s keyword arguments for it."""
    from tasks.api.live_keys import LIVE_KEYS

    app = app or asgi.application

    async def main() -> None:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        started = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                started.set()

        inbox.put_nowait({"type": "lifespan.startup"})
        lifespan = asyncio.create_task(app({"type": "lifespan"}, inbox.get, send))
        await asyncio.wait_for(started.wait(), 10)
        LIVE_KEYS.listen()  # what the first look-up would do; here before the calls, so that they find it up
        for _ in range(1000):  # keys are remembered only while their changes are heard
            if LIVE_KEYS.listening:
                break
            await asyncio.sleep(0.01)
        try:
            for request, kwargs in calls:
                await app(_scope(request, **kwargs), request.receive, request.send)
        finally:
            inbox.put_nowait({"type": "lifespan.shutdown"})
            await asyncio.wait_for(lifespan, 10)

    asyncio.run(main())


def assert_api_error(request: Request, status: int, code: str) -> dict[str, Any]:
    assert request.status == status, request.messages
    assert request.headers[b"content-type"] == b"application/json"
    body = request.json()
    assert set(body) == {"error", "message", "details"} and body["error"] == code
    return body


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
