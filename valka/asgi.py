"""ASGI entry point: `uvicorn valka.asgi:application`.

Requests for async views (the Server-Sent Events streams) go to Django's ASGI
handler, where a connected client costs a coroutine. Every other request (the
REST API, the admin, static files) runs the whole sync Django stack, middleware
included, in one thread of a pool, as under a threaded WSGI server. Django's ASGI
handler would instead move a sync request between the event loop and a thread
for each middleware hook and for the view: with the middleware of this project,
about fifteen hand-overs per request, which cost more CPU than the request itself
and keep concurrent requests from overlapping.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "valka.settings")

_django_asgi = get_asgi_application()  # sets Django up

from asgiref.sync import iscoroutinefunction  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.urls import Resolver404, resolve  # noqa: E402

from valka.conf import valka_settings  # noqa: E402

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
STREAM_BATCH = 256 * 1024  # bytes of a streaming response handed to the event loop at once


class Application:
    """Async views on Django's ASGI handler; every other request on its WSGI handler in a thread."""

    def __init__(self, threads: int) -> None:
        self.asgi = _django_asgi
        self.wsgi = WSGIHandler()
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="valka-web")

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not _async_view(scope):
            await self.sync_request(scope, receive, send)
        else:
            await self.asgi(scope, receive, send)

    async def sync_request(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """The body is read here, the request runs in one thread, and the response is sent from here:
        one hand-over each way. A streaming response is sent as its thread produces it."""
        body = await _read_body(receive)
        if body is None:
            return  # the client went away
        try:
            await self._respond(scope, body, send)
        finally:
            body.close()

    async def _respond(self, scope: dict[str, Any], body: Any, send: Send) -> None:
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        response = await loop.run_in_executor(
            self.executor, context.run, self._run, _environ(scope, body), loop, send)
        if response is not None:
            status, headers, content = response
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": content})

    def _run(self, environ: dict[str, Any], loop: asyncio.AbstractEventLoop,
             send: Send) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        """Run the request on this thread. A whole response is returned for the event loop to send;
        a streaming one (static files) is sent from here as it is read, so that this thread also
        closes it, and with it ends Django's request (database connections back to the pool)."""
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            started[:] = [int(status.split(" ", 1)[0]),
                          [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]]

        def send_now(message: dict[str, Any]) -> None:
            asyncio.run_coroutine_threadsafe(send(message), loop).result()

        response = self.wsgi(environ, start_response)
        with _closing(response):
            if not getattr(response, "streaming", False):
                return started[0], started[1], b"".join(response)
            send_now({"type": "http.response.start", "status": started[0], "headers": started[1]})
            batch: list[bytes] = []
            size = 0
            for chunk in response:
                batch.append(chunk)
                size += len(chunk)
                if size >= STREAM_BATCH:
                    send_now({"type": "http.response.body", "body": b"".join(batch), "more_body": True})
                    batch, size = [], 0
            send_now({"type": "http.response.body", "body": b"".join(batch)})
        return None


class _closing:
    def __init__(self, response: Iterable[bytes]) -> None:
        self.response = response

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        close = getattr(self.response, "close", None)
        if close is not None:
            close()


def _async_view(scope: dict[str, Any]) -> bool:
    return _is_async_path(settings.ROOT_URLCONF, _path_info(scope))


@functools.lru_cache(maxsize=4096)
def _is_async_path(urlconf: str, path: str) -> bool:
    """Whether `path` routes to an async view. Remembered per path: Django resolves the path
    again when it runs the request, and routing every request twice showed in profiles."""
    try:
        return iscoroutinefunction(resolve(path, urlconf).func)
    except Resolver404:
        return False


def _path_info(scope: dict[str, Any]) -> str:
    """The request path below the application's root path."""
    root = scope.get("root_path", "")
    path = scope["path"]
    if root and path.startswith(root):
        path = path[len(root):]
    return path


async def _read_body(receive: Receive) -> Any:
    """The request body in a spooled file (memory up to FILE_UPLOAD_MAX_MEMORY_SIZE), as Django's
    ASGI handler keeps it; None when the client disconnects first."""
    body = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b")
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            body.close()
            return None
        if chunk := message.get("body"):
            body.write(chunk)
        if not message.get("more_body"):
            break
    body.seek(0)
    return body


def _environ(scope: dict[str, Any], body: Any) -> dict[str, Any]:
    """The WSGI environ of an ASGI HTTP scope (PEP 3333 strings: latin-1 for bytes)."""
    root = scope.get("root_path", "")
    path = _path_info(scope)
    server = scope.get("server") or ("localhost", 80)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": root.encode().decode("latin-1"),
        "PATH_INFO": path.encode().decode("latin-1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] or 0),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": body,
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if client := scope.get("client"):
        environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = client[0], str(client[1])
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        if name not in ("CONTENT_LENGTH", "CONTENT_TYPE"):
            name = "HTTP_" + name
        value = raw_value.decode("latin-1")
        environ[name] = f"{environ[name]},{value}" if name in environ else value
    # The whole body was read: its real length (a chunked request has no Content-Length).
    body.seek(0, os.SEEK_END)
    environ["CONTENT_LENGTH"] = str(body.tell())
    body.seek(0)
    return environ


application = Application(threads=valka_settings.WEB_THREADS)
