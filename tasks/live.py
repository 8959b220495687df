"""Live feeds for subscribers in one process: task events and log wake-ups.

One LISTEN connection per process (per event loop) feeds every subscriber:
SSE clients of the web app, gRPC SubscribeEvents/SubscribeLogs streams of a
dispatcher. It is opened by the first subscription, not before, and closed a
while after the last one leaves: while it is open PostgreSQL builds and sends
an event for every status change, which costs it about a third of a drain's
work, so nobody should pay for events nobody reads. A subscriber that falls
QUEUE_LIMIT notifications behind is dropped rather than buffered without
end or allowed to slow everyone down: it gets the LAGGED marker, and its
stream tells its client so and ends (the client subscribes again).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tasks.notify import TASK_EVENT, TASK_LOG
from tasks.sql import live as sql

if TYPE_CHECKING:
    from valka.listen import Listener

log = logging.getLogger("valka.live")

QUEUE_LIMIT = 1_000  # notifications a subscriber may be behind (each at most 8,000 bytes)
LAGGED = "__lagged__"


class Lagged(Exception):
    """The subscriber fell QUEUE_LIMIT notifications behind and was dropped."""


class Fanout:
    """Subscribers per channel; `publish` never blocks. Given `conninfo`, the first subscription
    opens the LISTEN connection that feeds it, and `linger` seconds after the last subscriber
    leaves it is closed again.

    The connection registers itself as a task event watcher: the event triggers build and
    send events only while at least one watcher exists (see tasks/sql/schema/events.sql).

    `refusal`, given, is asked once, before the first LISTEN connection opens, why none should
    (valka.poolers.refuse_pooler): through a transaction pooler a LISTEN hears nothing, and the
    watcher it registers would have every change build events for nobody. Refused, the fanout
    logs why and never listens; subscribers get no notifications.
    """

    def __init__(self, conninfo: str | None = None, *, linger: float = 60.0,
                 refusal: Callable[[], Awaitable[str | None]] | None = None) -> None:
        self._subscribers: dict[str, set[asyncio.Queue[str]]] = {}
        self._conninfo = conninfo
        self._linger = linger
        self._refusal = refusal
        self.refused: str | None = None
        self._closed = False
        self._listener: asyncio.Task | None = None
        self._listener_stop = asyncio.Event()  # the current listener's
        self._listeners: set[asyncio.Task] = set()  # the current one, and any still closing
        self._idle: asyncio.TimerHandle | None = None
        self.listening: asyncio.Event | None = None  # set while the LISTEN connection is up

    def _listen(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._conninfo is None or self._closed or self.refused is not None or (
                self._listener is not None and not self._listener.done() and not self._listener_stop.is_set()):
            return
        from valka.listen import Listener

        listener = Listener(self._conninfo, {TASK_EVENT: self.publisher(TASK_EVENT),
                                             TASK_LOG: self.publisher(TASK_LOG)}, on_reconnect=lambda: None,
                            on_connect=_watch, on_stop=_unwatch)
        self.listening = listener.connected
        self._listener_stop = asyncio.Event()
        self._listener = asyncio.get_running_loop().create_task(self._run(listener, self._listener_stop))
        self._listeners.add(self._listener)
        self._listener.add_done_callback(self._listeners.discard)

    async def _run(self, listener: Listener, stop: asyncio.Event) -> None:
        if self._refusal is not None:
            refusal, self._refusal = self._refusal, None
            if (why := await refusal()) is not None:
                self.refused = why
                log.error("%s", why)
                return
        await listener.run(stop)

    def _release_if_idle(self) -> None:
        self._idle = None
        if not any(self._subscribers.values()):
            self._listener_stop.set()

    async def close(self) -> None:
        self._closed = True
        if self._idle is not None:
            self._idle.cancel()
        self._listener_stop.set()
        await asyncio.gather(*self._listeners, return_exceptions=True)

    async def ready(self, timeout: float = 15.0) -> None:
        """Wait (bounded) until notifications flow, so a new subscriber misses nothing after this,
        or until the listener ends (refused, or stopped).

        Bounded so that a stream still starts while the database is out of reach; generously,
        as a busy machine can take seconds to open the LISTEN connection."""
        if self.listening is None or self._listener is None:
            return
        connected = asyncio.ensure_future(self.listening.wait())
        try:
            await asyncio.wait({connected, self._listener}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            connected.cancel()

    def subscribe(self, channel: str) -> asyncio.Queue[str]:
        """A queue of the channel's payloads; `await ready()` before relying on what it will get."""
        queue: asyncio.Queue[str] = asyncio.Queue(QUEUE_LIMIT)
        self._subscribers.setdefault(channel, set()).add(queue)
        self._listen()
        return queue

    def unsubscribe(self, channel: str, queue: asyncio.Queue[str]) -> None:
        self._subscribers.get(channel, set()).discard(queue)
        if self._listener is not None and self._idle is None and not any(self._subscribers.values()):
            self._idle = asyncio.get_running_loop().call_later(self._linger, self._release_if_idle)

    def has_subscribers(self, channel: str) -> bool:
        return bool(self._subscribers.get(channel))

    def publisher(self, channel: str) -> Callable[[str], None]:
        def publish(payload: str) -> None:
            subscribers = self._subscribers.get(channel, set())
            for queue in list(subscribers):
                if queue.full():
                    # Fallen behind: it gets nothing more but the news, and its stream ends.
                    while not queue.empty():
                        queue.get_nowait()
                    queue.put_nowait(LAGGED)
                    subscribers.discard(queue)
                else:
                    queue.put_nowait(payload)

        return publish


async def _watch(conn: Any) -> None:
    await conn.execute(sql.WATCH_EVENTS)


async def _unwatch(conn: Any) -> None:
    await conn.execute(sql.UNWATCH_EVENTS)


def decode_events(payload: str, *, queue: str | None = None) -> list[dict[str, Any]]:
    """The events of one notification (a JSON array written by the task event triggers), only
    those of `queue` when one is given."""
    try:
        events = json.loads(payload)
    except ValueError:
        return []
    events = events if isinstance(events, list) else [events]
    return [e for e in events if e.get("queue_name") == queue] if queue else events


_hubs: dict[int, Fanout] = {}


def process_fanout() -> Fanout:
    """The fanout of this process's event loop (its LISTEN connection opens with the first subscriber,
    once a look has found no transaction pooler on its way: the web app has no start-up of its own
    to look at)."""
    from valka.db import conninfo
    from valka.poolers import refuse_pooler

    loop = asyncio.get_running_loop()
    fanout = _hubs.get(id(loop))
    if fanout is None:
        fanout = _hubs[id(loop)] = Fanout(conninfo(application_name="valka-web-listen", direct=True),
                                          refusal=lambda: refuse_pooler("web"))
    return fanout


class LogLine(Protocol):
    id: int


async def tail_run_log[L: LogLine](
    inbox: asyncio.Queue[str], *, run_id: str, after: int, wait: float,
    page: Callable[[str, int], Awaitable[Sequence[L]]], is_open: Callable[[str], Awaitable[bool]],
) -> AsyncIterator[Sequence[L] | None]:
    """A run's log lines after line id `after`, page by page, live until the run ends: the one
    loop behind the SSE log stream and gRPC SubscribeLogs.

    `inbox` is a subscription to TASK_LOG (subscribed, and `ready()` awaited, before the first
    page is read, so no line written after it is missed); `page(run_id, after)` reads the next
    lines and `is_open(run_id)` whether the run is still RUNNING. Once it is not, the lines
    written before it closed are read once more and the tail ends. Yields None when `wait`
    seconds pass without a wake-up (time for a keep-alive); raises Lagged when the subscription
    fell behind.
    """
    while True:
        lines = await page(run_id, after)
        if lines:
            after = lines[-1].id
            yield lines
        if not await is_open(run_id):
            lines = await page(run_id, after)  # the last lines before the run closed
            if lines:
                yield lines
            return
        try:
            while (payload := await asyncio.wait_for(inbox.get(), wait)) != run_id:
                if payload == LAGGED:
                    raise Lagged(run_id)
        except TimeoutError:
            yield None
