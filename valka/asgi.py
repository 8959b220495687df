"""ASGI entry point: `uvicorn valka.asgi:application`.

Requests for async views (the Server-Sent Events streams) go to Django's ASGI
handler, where a connected client costs a coroutine. Every other request (the
REST API, the admin, static files) runs the whole sync Django stack, middleware
included, in one thread of a pool, as under a threaded WSGI server. Django's ASGI
handler would instead move a sync request between the event loop and a thread
for each middleware hook and for the view: with the middleware of this project,
about fifteen hand-overs per request, which cost more CPU than the request itself
and keep concurrent requests from overlapping.

Every request body is read here, before either handler sees it, and within limits:
- a request with a body to the REST API (under /api/, but for its public schema and docs pages)
  must first present a credential, unless VALKA_API_ANONYMOUS opens the API: with no
  `Authorization` header and no signed-in session it is answered 401 without a byte of its body
  read, and so is an `Authorization` header that names no live API key (the key, or the session
  behind a cookie, is looked up in a web thread first). Django then checks the session fully,
  and the CSRF token with it;
- but the REST create with an API key and a body announced at no more than ANONYMOUS_BODY_LIMIT
  bytes has its body read first: the key's look-up and the create then take one hand-over to a
  web thread, without Django's request cycle (tasks.api.direct), and a key that is not live gets
  the same 401;
- elsewhere (the admin's login page, say) a caller with no signed-in session has at most
  ANONYMOUS_BODY_LIMIT bytes of its body read, and a 413 past them;
- no more than DATA_UPLOAD_MAX_MEMORY_SIZE bytes are read: a `Content-Length` announcing more is
  answered 413 before anything is read, and a body that grows past it is answered 413 as soon as
  it does, the rest left unread;
- the body is kept in memory up to FILE_UPLOAD_MAX_MEMORY_SIZE, and past it (a limit raised that
  high) in a temporary file written in a thread, never on the event loop.
A body left unread is the server's to discard (uvicorn skips it once the response is sent).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import io
import json
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from importlib import import_module
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "valka.settings")

_django_asgi = get_asgi_application()  # sets Django up

from asgiref.sync import iscoroutinefunction  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import SESSION_KEY  # noqa: E402
from django.core.handlers.wsgi import WSGIHandler, WSGIRequest  # noqa: E402
from django.db import close_old_connections  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.http.cookie import parse_cookie  # noqa: E402
from django.urls import Resolver404, resolve  # noqa: E402

from tasks.api import direct  # noqa: E402
from tasks.api.auth import KEY_ENVIRON, api_key_live_apart, bearer_key  # noqa: E402
from tasks.api.errors import error_body  # noqa: E402
from tasks.api.live_keys import LIVE_KEYS  # noqa: E402
from tasks.models import ApiKey  # noqa: E402
from valka.conf import refuse_development_key, valka_settings  # noqa: E402
from valka.db import conninfo  # noqa: E402
from valka.tracing import configure as configure_tracing  # noqa: E402

if (_refused := refuse_development_key("web")) is not None:
    print(_refused, file=sys.stderr)
    raise SystemExit(1)
configure_tracing("web")  # a tracer provider, when the environment asks for one (docs/tracing.md)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
STREAM_BATCH = 256 * 1024  # bytes of a streaming response handed to the event loop at once
API_PREFIX = "/api/"
API_PUBLIC = frozenset({"schema", "docs"})  # /api/schema/, /api/docs/: public pages
# The most body bytes read from a caller not signed in outside the API (a login form is < 1 KiB).
ANONYMOUS_BODY_LIMIT = 64 * 1024


class _BodyTooLarge(Exception):
    """More of the body arrived than the limit allows."""


class Application:
    """Async views on Django's ASGI handler; every other request on its WSGI handler in a thread."""

    def __init__(self, threads: int) -> None:
        self.asgi = _django_asgi
        self.wsgi = WSGIHandler()
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="valka-web")
        self.creates = direct.LoopPool()  # opened with the server: creates on the event loop

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        else:
            await self.asgi(scope, receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        """The server's start and stop (Django's handler takes no lifespan): while it serves, the
        process remembers the live API keys it finds (tasks.api.live_keys), and keeps the
        connections that REST creates use on the event loop (tasks.api.direct `LoopPool`)."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                LIVE_KEYS.start(functools.partial(conninfo, application_name="valka-web api keys", direct=True))
                await self.creates.open()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.creates.close()
                await asyncio.get_running_loop().run_in_executor(None, LIVE_KEYS.stop)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """A caller the REST API would refuse is refused before its body is read; the body is read
        within the limit; then a sync view runs in a thread, an async one on Django's ASGI handler."""
        api = _is_api(_path_info(scope))
        if api and _direct(scope):
            await self.direct_create(scope, receive, send)
            return
        key = None
        known = True  # the caller is known, or need not be: the whole limit applies to its body
        if _has_body(scope):
            if api and not valka_settings.API_ANONYMOUS:
                refusal, key = await self._refusal(scope)
                if refusal is not None:
                    await _send_unauthorized(scope, send, refusal)
                    return
            elif not api:
                known = await self._signed_in(scope)
        is_async = _async_view(scope)
        limit = _body_limit(is_async)
        if not known:
            limit = ANONYMOUS_BODY_LIMIT if limit is None else min(limit, ANONYMOUS_BODY_LIMIT)
        announced = _content_length(scope)
        try:
            if limit is not None and announced is not None and announced > limit:
                raise _BodyTooLarge
            read = await _read_body(receive, limit)
        except _BodyTooLarge:
            await _send_error(scope, send, 413, "PAYLOAD_TOO_LARGE", f"body: larger than the limit of {limit} bytes",
                              {"body": [f"larger than {limit} bytes"]}, api=api)
            return
        if read is None:
            return  # the client went away
        body, size = read
        try:
            if is_async:
                await self.asgi(scope, _replay(body.getvalue(), receive), send)
            else:
                await self.sync_request(scope, body, size, send, key)
        finally:
            _close(body)

    async def direct_create(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """A REST create with an API key and a small body (`_direct`): the body read, then the create
        on the event loop when its key is remembered (tasks.api.direct `create_on_loop`), else the
        key's look-up and the create in one web thread. What that path hands back goes to the
        whole stack, with the live key it found."""
        try:
            read = await _read_body(receive, _content_length(scope))
        except _BodyTooLarge:  # more than announced: the server's framing allows no such thing
            await _send_error(scope, send, 400, "VALIDATION_ERROR", "body: longer than its Content-Length",
                              {"body": ["longer than its Content-Length"]}, api=True)
            return
        if read is None:
            return  # the client went away
        body, size = read
        try:
            environ = _environ(scope, body, size)
            outcome = await direct.create_on_loop(environ, self.creates) if self.creates.ready else None
            if outcome is None:
                outcome = await self._in_thread(direct.create, environ)
            if outcome.answer is not None:
                status, headers, content = outcome.answer
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": content})
            elif outcome.key is None:
                await _send_unauthorized(scope, send, "invalid API key")
            else:
                await self.sync_request(scope, body, size, send, outcome.key)
        finally:
            _close(body)

    async def _refusal(self, scope: dict[str, Any]) -> tuple[str | None, ApiKey | None]:
        """Why the REST API would refuse this caller (its message) or None, and the live API key it
        presents, if any: handed on to the API's authentication, which then does not look it up
        again. A session must have a user signed in (Django then checks the rest). A key is looked
        for first, and a bad one is refused whatever else comes with it, as the API's
        authentication does."""
        authorization = _header(scope, b"authorization").decode("latin-1")
        if authorization:
            key = bearer_key(authorization)
            if key is None:
                return "invalid authorization header", None
            live = await self._in_thread(api_key_live_apart, key)
            return (None, live) if live is not None else ("invalid API key", None)
        if await self._signed_in(scope):
            return None, None
        return "Authentication credentials were not provided.", None

    async def _signed_in(self, scope: dict[str, Any]) -> bool:
        """Whether the request's session cookie names a session with a user signed in (looked up in
        a web thread; whether that user may do anything is Django's to judge)."""
        session_key = _session_key(scope)
        if not session_key:
            return False
        return await self._in_thread(_session_user, session_key)

    async def _in_thread(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` in a web thread, in this request's context: one hand-over each way,
        without the layers asgiref's sync_to_async adds around it (nor run_in_executor's check that
        `function` is no coroutine function, which showed in profiles)."""
        context = contextvars.copy_context()
        return await asyncio.wrap_future(self.executor.submit(context.run, function, *args))

    async def sync_request(self, scope: dict[str, Any], body: Any, size: int, send: Send,
                           key: ApiKey | None = None) -> None:
        """The request runs in one thread, and the response is sent from here: one hand-over each
        way. A streaming response is sent as its thread produces it."""
        response = await self._in_thread(self._run, _environ(scope, body, size, key), asyncio.get_running_loop(),
                                         send)
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


def _direct(scope: dict[str, Any]) -> bool:
    """Whether the request goes to the REST create's direct path (tasks.api.direct): a candidate
    there, with a body announced by its Content-Length and small enough to be read before the key
    is looked up (in the same hand-over to a web thread), as a caller not signed in may send to
    the admin's login page."""
    length = _content_length(scope)
    return (length is not None and 0 < length <= min(ANONYMOUS_BODY_LIMIT, _body_limit(False) or length)
            and not _header(scope, b"transfer-encoding")
            and direct.candidate(_path_info(scope), scope["method"],
                                 _header(scope, b"authorization").decode("latin-1")))


def _path_info(scope: dict[str, Any]) -> str:
    """The request path below the application's root path."""
    root = scope.get("root_path", "")
    path = scope["path"]
    if root and path.startswith(root):
        path = path[len(root):]
    return path


def _is_api(path: str) -> bool:
    """Whether `path` is the REST API's, whose callers present a credential (not its schema or docs)."""
    if not path.startswith(API_PREFIX):
        return False
    return path[len(API_PREFIX):].split("/", 1)[0] not in API_PUBLIC


def _header(scope: dict[str, Any], name: bytes) -> bytes:
    """A request header's value (repeated ones joined with commas, as in the WSGI environ); b"" without it."""
    return b",".join(value for key, value in scope.get("headers", ()) if key.lower() == name)


def _content_length(scope: dict[str, Any]) -> int | None:
    """The body's announced length; None when not announced (or not a number, for the server to refuse)."""
    value = _header(scope, b"content-length")
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _has_body(scope: dict[str, Any]) -> bool:
    """Whether the request may carry a body: a length above 0, or a chunked one; over HTTP/2 and
    later a body needs no header to announce it."""
    if _header(scope, b"transfer-encoding"):
        return True
    if _header(scope, b"content-length"):
        length = _content_length(scope)
        return length is None or length > 0
    return scope.get("http_version", "1.1") not in ("1.0", "1.1")


def _session_key(scope: dict[str, Any]) -> str:
    """The value of Django's session cookie in the request, or ""."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"cookie" and (key := parse_cookie(value.decode("latin-1")).get(
                settings.SESSION_COOKIE_NAME)):
            return key
    return ""


def _session_user(session_key: str) -> bool:
    """In a web thread: whether the session `session_key` names has a user signed in (none held afterwards)."""
    close_old_connections()
    try:
        return bool(import_module(settings.SESSION_ENGINE).SessionStore(session_key).get(SESSION_KEY))
    finally:
        close_old_connections()


def _body_limit(is_async: bool) -> int | None:
    """The most body bytes read (None: no limit, as DATA_UPLOAD_MAX_MEMORY_SIZE None means to
    Django). An async view's body is handed to Django's ASGI handler, which would write past
    FILE_UPLOAD_MAX_MEMORY_SIZE to a file on the event loop, so it is kept under that too."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if is_async:
        memory = settings.FILE_UPLOAD_MAX_MEMORY_SIZE
        limit = memory if limit is None else min(limit, memory)
    return limit


async def _send_unauthorized(scope: dict[str, Any], send: Send, message: str) -> None:
    await _send_error(scope, send, 401, "UNAUTHORIZED", message, api=True,
                      headers=[(b"www-authenticate", b"Bearer")])


async def _send_error(scope: dict[str, Any], send: Send, status: int, code: str, message: str,
                      details: dict[str, Any] | None = None, *, api: bool,
                      headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """An answer of our own: the REST API's error shape, or plain text outside the API, with the
    headers the security middleware gives Django's answers."""
    if api:
        content = json.dumps(error_body(code, message, details)).encode()
        content_type = b"application/json"
    else:
        content = message.encode()
        content_type = b"text/plain; charset=utf-8"
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type), (b"content-length", str(len(content)).encode()),
        *_security_headers(scope), *headers]})
    await send({"type": "http.response.body", "body": content})


# The middleware whose response phases add headers to every answer of Django's (security headers,
# X-Frame-Options); they need no database and no view, so they run on the answers given here too.
SECURITY_MIDDLEWARE = ("django.middleware.security.SecurityMiddleware",
                       "django.middleware.clickjacking.XFrameOptionsMiddleware")


@functools.cache
def _security_middleware() -> tuple[Any, ...]:
    """Instances of the settings' SECURITY_MIDDLEWARE, in the order their response phases run."""
    return tuple(reversed(direct.middleware_phases(SECURITY_MIDDLEWARE)))


def _security_headers(scope: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    """The headers the security middleware adds to an empty answer to this request, and
    X-Content-Type-Options: nosniff in any case (the answers given here are never to be sniffed)."""
    request = WSGIRequest(_environ(scope, io.BytesIO(), 0))
    response = HttpResponse()
    del response["Content-Type"]
    for middleware in _security_middleware():
        response = middleware.process_response(request, response)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in response.items()]


async def _read_body(receive: Receive, limit: int | None) -> tuple[Any, int] | None:
    """The request body and its length, read as it arrives; None when the client disconnects first.
    Raises _BodyTooLarge as soon as more than `limit` bytes have arrived, the rest left unread.
    The body is kept in memory up to FILE_UPLOAD_MAX_MEMORY_SIZE; past it, in a temporary file
    created and written in a thread, never on the event loop."""
    memory = settings.FILE_UPLOAD_MAX_MEMORY_SIZE
    chunks: list[bytes] = []
    size = 0
    spill: Any = None
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            if chunk := message.get("body"):
                size += len(chunk)
                if limit is not None and size > limit:
                    raise _BodyTooLarge
                chunks.append(chunk)
                if spill is not None or size > memory:
                    if spill is None:
                        spill = await asyncio.to_thread(tempfile.TemporaryFile, mode="w+b")
                    await asyncio.to_thread(spill.writelines, chunks)
                    chunks = []
            if not message.get("more_body"):
                break
        if spill is None:
            return io.BytesIO(b"".join(chunks)), size
        await asyncio.to_thread(spill.seek, 0)  # flushes the file's buffer: a write
        body, spill = spill, None
        return body, size
    finally:
        if spill is not None:
            _close(spill)


def _close(body: Any) -> None:
    """Close a body: a file's in a thread (it may free its disk blocks), not waited for."""
    if isinstance(body, io.BytesIO):
        body.close()
    else:
        asyncio.get_running_loop().run_in_executor(None, body.close)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` for Django's ASGI handler: the body read here, then the client's own messages
    (its disconnect, which an event stream waits for)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> dict[str, Any]:
        if pending:
            return pending.pop()
        return await receive()

    return replay


def _environ(scope: dict[str, Any], body: Any, size: int, key: ApiKey | None = None) -> dict[str, Any]:
    """The WSGI environ of an ASGI HTTP scope (PEP 3333 strings: latin-1 for bytes), with the API
    key already found live for this request (no header can set that entry)."""
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
    environ["CONTENT_LENGTH"] = str(size)
    if key is not None:
        environ[KEY_ENVIRON] = key
    return environ


application = Application(threads=valka_settings.WEB_THREADS)
