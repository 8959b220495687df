"""The REST create (`POST /api/v1/tasks`) from an API key, answered without Django's request cycle.

One create through the whole stack spent most of the web process's CPU on what does not serve
its result: the WSGI request and its middleware chain, DRF's dispatch (authentication,
permissions, negotiation, parsing, the response's rendering and finalising), and a second
hand-over to a web thread for the key's look-up made before the body was read. Producers send
creates by the thousand, nearly all alike: a key, a small JSON body, nothing else. valka.asgi
hands such a request (`candidate`) here, in one web thread, and `create` answers it with the
same steps the stack would take and the same answer:

- the key is looked up, and a key that is not live is refused (valka.asgi answers 401, as it
  answers before reading a body elsewhere);
- the host is checked against ALLOWED_HOSTS, and the request phases of the middleware that has
  any for such a request run (SecurityMiddleware's HTTPS redirect, CommonMiddleware's checks);
- the key's scope must allow creating tasks, its use is noted (`auth.note_use`), and the body is
  parsed and validated by the API's own parser and `parse_task_spec`;
- the task is created by the service, in the request's trace context (TraceContextMiddleware's);
- the answer is the API's renderer's, with DRF's `Allow` header, through the response phases of
  the same middleware (the security headers, X-Frame-Options).

Anything else, before a write, is handed back (`Outcome.key` set, `answer` None) for the full
stack to answer, the key it found handed on: an Accept or Content-Type other than plain JSON, a
query string, a scope that falls short, a body that fails validation, a redirect, a host not
allowed. Those requests then pay for the stack, as every request did before, and get its exact
answer: only the common success is answered here. A failure after the INSERT (a lost
connection) gets Django's own answer for it (`response_for_exception`), never a second try.

The path is off altogether (`ENABLED`) when settings add middleware it does not stand in for,
or give the view other authentication, permission, parser, renderer or throttle classes than
the API's own: then every request takes the stack. tests/tasks/api/test_direct.py holds the
two paths to the same answers.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import signals
from django.core.handlers.exception import response_for_exception
from django.core.handlers.wsgi import WSGIRequest
from django.db import DEFAULT_DB_ALIAS, connections
from django.http import HttpResponse
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from tasks import services
from tasks.api import auth
from tasks.api.negotiation import JSON, PLAIN_ACCEPTS, ValkaContentNegotiation
from tasks.api.parsers import ValkaJSONParser
from tasks.api.renderers import ValkaJSONRenderer
from tasks.api.serializers import task_data
from tasks.api.views import TaskViewSet
from tasks.errors import ValkaError
from tasks.models import ApiKey
from tasks.specs import TaskSpec, parse_json_text, parse_task_spec
from valka.conf import valka_settings
from valka.db import conninfo, prepared_statements
from valka.tracing import request_attached

# Middleware with nothing to do for a key's create: the session, its user, messages and CSRF
# serve the admin's signed-in users (DRF's views are exempt from CSRF, and a key needs none);
# WhiteNoise serves only static files.
IDLE_MIDDLEWARE = frozenset({
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
})
# Middleware whose request and response phases run here, as the stack runs them.
RUN_MIDDLEWARE = frozenset({
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
})
TRACE_MIDDLEWARE = "valka.tracing.TraceContextMiddleware"  # `request_attached`
# What DRF's finalize_response puts in the create's answer: the methods of its route.
ALLOW = "GET, POST, HEAD, OPTIONS"
JSON_TYPES = frozenset({JSON, f"{JSON}; charset=utf-8"})

_render = ValkaJSONRenderer().render


class LoopPool:
    """The web process's async connections for `create_on_loop`, opened with the server
    (valka.asgi's lifespan; without one, every create takes a web thread). As many at most as the
    process has web threads (VALKA_WEB_THREADS), which bound the thread path's connections: a
    create holds one for its one statement, in autocommit, and more wait their turn. Each is set
    up as Django sets up its own (the session's time zone), and runs the statement prepared
    where Django's connections may keep prepared statements (valka.db `prepared_statements`)."""

    WAIT = 10.0  # seconds a create waits for a connection before it fails (Django's connect_timeout)

    def __init__(self) -> None:
        self._pool: AsyncConnectionPool | None = None
        self._prepare = False

    @property
    def ready(self) -> bool:
        return self._pool is not None

    async def open(self) -> None:
        if not ENABLED:
            return
        timezone_name = connections[DEFAULT_DB_ALIAS].timezone_name

        async def configure(conn: AsyncConnection) -> None:
            await conn.execute("SELECT set_config('TimeZone', %s, false)", [timezone_name])

        self._prepare = prepared_statements()
        self._pool = AsyncConnectionPool(conninfo(application_name="valka-web creates"), min_size=1,
                                         max_size=valka_settings.WEB_THREADS, kwargs={"autocommit": True},
                                         configure=configure, timeout=self.WAIT, open=False)
        await self._pool.open(wait=False)  # a database not up yet is waited for by the first create

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def fetchone(self, sql: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        assert self._pool is not None
        async with self._pool.connection() as conn:
            cursor = await conn.execute(sql, params, prepare=self._prepare)
            return await cursor.fetchone()


@dataclass(frozen=True)
class Outcome:
    """What `create` did: `answer` (status, headers, body) when it answered; otherwise the full
    stack answers, with `key`, the live key found, or 401 when there is none."""

    key: ApiKey | None
    answer: tuple[int, list[tuple[bytes, bytes]], bytes] | None = None


def _enabled() -> tuple[bool, list[Any]]:
    """Whether the settings leave the create as this module answers it, and the middleware whose
    phases it runs (instances, in settings order)."""
    names = list(settings.MIDDLEWARE)
    if not set(names) <= IDLE_MIDDLEWARE | RUN_MIDDLEWARE | {TRACE_MIDDLEWARE}:
        return False, []
    view = TaskViewSet
    if (list(view.authentication_classes)[:1] != [auth.ApiKeyAuthentication]
            or list(view.permission_classes) != [auth.ApiAccess]
            or list(view.parser_classes) != [ValkaJSONParser]
            or list(view.renderer_classes) != [ValkaJSONRenderer]
            or view.content_negotiation_class is not ValkaContentNegotiation
            or view.throttle_classes or view.versioning_class is not None):
        return False, []
    return True, middleware_phases(RUN_MIDDLEWARE)


def middleware_phases(names: frozenset[str] | tuple[str, ...]) -> list[Any]:
    """Instances of the settings' middleware among `names`, in settings order, for a caller that
    runs their request and response phases itself, outside Django's chain (which they never call)."""
    return [import_string(name)(_unused) for name in settings.MIDDLEWARE if name in names]


def _unused(request: Any) -> Any:
    raise AssertionError("the middleware's phases run here one by one, never its chain")


ENABLED, _MIDDLEWARE = _enabled()


def candidate(path: str, method: str, authorization: str) -> bool:
    """Whether a request may be answered here, by what valka.asgi sees before reading its body:
    a POST to the create's route with an API key. The rest is judged by `create`."""
    if not ENABLED or method != "POST" or not _is_create(settings.ROOT_URLCONF, path):
        return False
    return auth.bearer_key(authorization) is not None


@functools.lru_cache(maxsize=64)
def _is_create(urlconf: str, path: str) -> bool:
    """Whether `path` routes to TaskViewSet's create (remembered per path)."""
    try:
        func = resolve(path, urlconf).func
    except Resolver404:
        return False
    return getattr(func, "cls", None) is TaskViewSet and getattr(func, "actions", {}).get("post") == "create"


def create(environ: dict[str, Any]) -> Outcome:
    """In a web thread: the create `environ` asks for (a `candidate`, its body read), as the
    module's docstring says. Begins and ends as Django's handler does a request (its signals: the
    thread's database connection back to the pool afterwards)."""
    signals.request_started.send(sender=create, environ=environ)
    try:
        request = WSGIRequest(environ)
        key = auth.api_key_of(request.META["HTTP_AUTHORIZATION"])
        if key is None:
            return Outcome(key=None)
        with request_attached(request):
            return _create(request, key, environ["wsgi.input"].getvalue())
    finally:
        signals.request_finished.send(sender=create)


def _plain_spec(request: WSGIRequest, key: ApiKey, body: bytes) -> TaskSpec | None:
    """The task a plain create asks for, its key's use noted; None for what the stack is to answer
    (whatever fails here, before a write, fails there again and gets its answer)."""
    if (request.META.get("QUERY_STRING") or request.META.get("HTTP_ACCEPT", "*/*") not in PLAIN_ACCEPTS
            or request.META.get("CONTENT_TYPE", "").lower() not in JSON_TYPES
            or not key.allows(auth.CREATE_TASKS.scope)):
        return None
    try:
        request.get_host()  # DisallowedHost
        for middleware in _MIDDLEWARE:
            process = getattr(middleware, "process_request", None)
            if process is not None and process(request) is not None:
                return None  # a redirect
        auth.note_use(key)
        return parse_task_spec(parse_json_text(body.decode(request.encoding or settings.DEFAULT_CHARSET)))
    except Exception:  # noqa: BLE001 - a host or user agent refused, a body not valid, a database error
        return None


def _create(request: WSGIRequest, key: ApiKey, body: bytes) -> Outcome:
    handed_back = Outcome(key=key)
    spec = _plain_spec(request, key, body)
    if spec is None:
        return handed_back
    try:
        task, created = services.task_create(spec=spec)
    except ValkaError:
        return handed_back  # written nothing (ids reused concurrently): the stack tries again
    except Exception as exc:  # noqa: BLE001 - answered as Django answers it
        return _answered(request, key, response_for_exception(request, exc))
    return _answer(request, key, task, created)


async def create_on_loop(environ: dict[str, Any], pool: LoopPool) -> Outcome | None:
    """On the event loop: the create `environ` asks for, as `create` makes it, its one statement on
    an async connection of `pool`. None when it must take a web thread instead: its key is not
    remembered (its look-up reads the database) or its use is due to be written (a write), so that
    nothing here waits on the database but the INSERT itself, awaited. Saves the hand-over to a
    web thread and back: about a sixth of the web process's CPU per create, and the wait for the
    interpreter lock between the thread and the loop."""
    key = auth.api_key_remembered(environ["HTTP_AUTHORIZATION"])
    if key is None or auth.use_due(key, margin=1.0):  # its use noted below must not be a write
        return None
    signals.request_started.send(sender=create_on_loop, environ=environ)
    try:
        request = WSGIRequest(environ)
        with request_attached(request):
            spec = _plain_spec(request, key, environ["wsgi.input"].getvalue())
            if spec is None:
                return Outcome(key=key)
            try:
                task = await services.task_create_awaited(spec, pool.fetchone)
            except Exception as exc:  # noqa: BLE001 - answered as Django answers it
                return _answered(request, key, response_for_exception(request, exc))
            if task is None:
                return Outcome(key=key)  # its id or key is held: the stack answers with the holder
            return _answer(request, key, task, True)
    finally:
        signals.request_finished.send(sender=create_on_loop)


def _answer(request: WSGIRequest, key: ApiKey, task: Any, created: bool) -> Outcome:
    try:
        response = HttpResponse(_render(task_data(task)), status=201 if created else 200, content_type=JSON)
        response["Allow"] = ALLOW
    except Exception as exc:  # noqa: BLE001 - the task is created: answered as Django answers it
        response = response_for_exception(request, exc)
    return _answered(request, key, response)


def _answered(request: WSGIRequest, key: ApiKey, response: HttpResponse) -> Outcome:
    """`response` through the middleware's response phases, as the answer."""
    for middleware in reversed(_MIDDLEWARE):
        process = getattr(middleware, "process_response", None)
        if process is not None:
            response = process(request, response)
    headers = [*response.items(), *(("Set-Cookie", c.output(header="")) for c in response.cookies.values())]
    encoded = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    return Outcome(key=key, answer=(response.status_code, encoded, response.content))
