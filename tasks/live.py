"""Live feeds for subscribers in one process: task events and log wake-ups.

One LISTEN connection per process (per event loop) feeds every subscriber:
SSE clients of the web app, gRPC SubscribeEvents/SubscribeLogs streams of a
dispatcher. It is opened by the first subscription, not before: every status
change is a notification, and a process nobody watches through should not
receive (and PostgreSQL should not deliver) them all. A subscriber that falls
behind loses the oldest notifications rather than slowing everyone down (it
is told with an `overflow` marker).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from tasks.notify import TASK_EVENT, TASK_LOG

QUEUE_LIMIT = 10_000
OVERFLOW = "__overflow__"


class Fanout:
    """Subscribers per channel; `publish` never blocks. Given `conninfo`, the first subscription
    opens the LISTEN connection that feeds it (kept until `close`)."""

    def __init__(self, conninfo: str | None = None) -> None:
        self._subscribers: dict[str, set[asyncio.Queue[str]]] = {}
        self._conninfo = conninfo
        self._stop = asyncio.Event()
        self._listener: asyncio.Task | None = None
        self.listening: asyncio.Event | None = None  # set while the LISTEN connection is up

    def _listen(self) -> None:
        if self._conninfo is None or (self._listener is not None and not self._listener.done()):
            return
        from valka.listen import Listener

        listener = Listener(self._conninfo, {TASK_EVENT: self.publisher(TASK_EVENT),
                                             TASK_LOG: self.publisher(TASK_LOG)}, on_reconnect=lambda: None)
        self.listening = listener.connected
        self._listener = asyncio.get_running_loop().create_task(listener.run(self._stop))

    async def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            await asyncio.gather(self._listener, return_exceptions=True)

    async def ready(self, timeout: float = 5.0) -> None:
        """Wait (bounded) until notifications flow, so a new subscriber misses nothing after this."""
        if self.listening is not None:
            try:
                await asyncio.wait_for(self.listening.wait(), timeout)
            except TimeoutError:
                pass

    def subscribe(self, channel: str) -> asyncio.Queue[str]:
        """A queue of the channel's payloads; `await ready()` before relying on what it will get."""
        queue: asyncio.Queue[str] = asyncio.Queue(QUEUE_LIMIT)
        self._subscribers.setdefault(channel, set()).add(queue)
        self._listen()
        return queue

    def unsubscribe(self, channel: str, queue: asyncio.Queue[str]) -> None:
        self._subscribers.get(channel, set()).discard(queue)

    def has_subscribers(self, channel: str) -> bool:
        return bool(self._subscribers.get(channel))

    def publisher(self, channel: str) -> Callable[[str], None]:
        def publish(payload: str) -> None:
            for queue in self._subscribers.get(channel, ()):
                if queue.full():
                    queue.get_nowait()
                    queue.put_nowait(OVERFLOW)
                queue.put_nowait(payload)

        return publish


def decode_events(payload: str) -> list[dict[str, Any]]:
    """The events of one notification (a JSON array written by the task event triggers)."""
    try:
        events = json.loads(payload)
    except ValueError:
        return []
    return events if isinstance(events, list) else [events]


_hubs: dict[int, Fanout] = {}


def process_fanout() -> Fanout:
    """The fanout of this process's event loop (its LISTEN connection opens with the first subscriber)."""
    from dispatcher.db import conninfo

    loop = asyncio.get_running_loop()
    fanout = _hubs.get(id(loop))
    if fanout is None:
        fanout = _hubs[id(loop)] = Fanout(conninfo(application_name="valka-web-listen"))
    return fanout
