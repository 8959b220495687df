"""The REST benchmarks' HTTP load: keep-alive connections, each sending its POSTs one after the
other, with the least CPU a client can spend on them.

On this two-core machine the client shares the cores with the web app it measures, so every
microsecond it spends is taken from the server. aiohttp's client spent 245–310 µs of CPU per
REST create, a fifth of the create's cost across the processes. Here each connection is an
asyncio protocol on uvloop that writes a request's bytes and reads the answer with httptools (the
C parser uvicorn's server side uses): 50–60 µs per create. A client on another machine, as the
callers of a deployed API are, costs the server's cores nothing.

Every answer is parsed in full and its status checked: a failed request stops the load with an
error naming it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import httptools
import uvloop


class LoadError(RuntimeError):
    pass


class _Connection(asyncio.Protocol):
    """One keep-alive connection: sends the next request when the previous answer is complete."""

    def __init__(self, requests: Iterator[bytes], done: asyncio.Future[None], answered: Callable[[], None],
                 ok: frozenset[int]) -> None:
        self._requests = requests
        self._done = done
        self._answered = answered
        self._ok = ok
        self._parser = httptools.HttpResponseParser(self)
        self._body = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's, not asyncio's class

    def start(self) -> None:
        self._send_next()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(LoadError(f"unparsable answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(LoadError(f"connection closed before the load was done: {exc}"))

    # httptools' callbacks
    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if status not in self._ok:
            self._fail(LoadError(f"answered {status}: {bytes(self._body[:300])!r}"))
            return
        self._body.clear()
        self._answered()
        self._send_next()

    def _send_next(self) -> None:
        assert self._transport is not None
        request = next(self._requests, None)
        if request is None:
            if not self._done.done():
                self._done.set_result(None)
            self._transport.close()
        else:
            self._transport.write(request)

    def close(self) -> None:
        if not self._done.done():
            self._done.cancel()  # the load stopped on another connection's failure
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def _fail(self, exc: Exception) -> None:
        if not self._done.done():
            self._done.set_exception(exc)
        if self._transport is not None:
            self._transport.close()


def post_request(url: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The bytes of one HTTP/1.1 POST with a JSON body, as the connections send it."""
    host = urlsplit(url).netloc
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def run(url: str, requests: Callable[[int], Iterator[bytes]], *, connections: int, answered: Callable[[], None],
        ok: frozenset[int] = frozenset({200, 201})) -> float:
    """Open `connections` connections to `url` (http://host:port), then send on each its
    `requests(index)`, one at a time. Returns the seconds from the first request sent until every
    answer was in; raises LoadError on the first answer whose status is not in `ok`."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None or parts.port is None:
        raise ValueError(f"url: expected http://host:port, got {url!r}")
    host, port = parts.hostname, parts.port

    async def main() -> float:
        loop = asyncio.get_running_loop()
        opened: list[_Connection] = []
        finished: list[asyncio.Future[None]] = []
        for index in range(connections):
            done: asyncio.Future[None] = loop.create_future()
            _, conn = await loop.create_connection(
                lambda i=index, d=done: _Connection(requests(i), d, answered, ok), host, port)  # type: ignore[misc]
            opened.append(conn)
            finished.append(done)
        try:
            start = time.perf_counter()
            for conn in opened:
                conn.start()
            await asyncio.gather(*finished)
            return time.perf_counter() - start
        finally:
            for conn in opened:
                conn.close()

    return asyncio.run(main(), loop_factory=uvloop.new_event_loop)
