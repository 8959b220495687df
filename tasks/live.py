"""Live feeds for subscribers in one process: task events and log wake-ups.

One LISTEN connection per process (per event loop) feeds every subscriber:
SSE clients of the web app, gRPC SubscribeEvents/SubscribeLogs streams of a
dispatcher. A subscriber that falls behind loses the oldest notifications
rather than slowing everyone down (it is told with an `overflow` marker).
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
    """Subscribers per channel; `publish` never blocks."""

    def __init__(self) -> None:
        self._subscribers: dict[str, set[asyncio.Queue[str]]] = {}
        self.listening: asyncio.Event | None = None  # set while the LISTEN connection is up

    async def ready(self, timeout: float = 5.0) -> None:
        """Wait (bounded) until notifications flow, so a new subscriber misses nothing after this."""
        if self.listening is not None:
            try:
                await asyncio.wait_for(self.listening.wait(), timeout)
            except TimeoutError:
                pass

    def subscribe(self, channel: str) -> asyncio.Queue[str]:
        queue: asyncio.Queue[str] = asyncio.Queue(QUEUE_LIMIT)
        self._subscribers.setdefault(channel, set()).add(queue)
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


_hubs: dict[int, tuple[Fanout, asyncio.Task]] = {}


def process_fanout() -> Fanout:
    """The fanout of this process's event loop, started on first use."""
    from dispatcher.db import conninfo
    from valka.listen import Listener

    loop = asyncio.get_running_loop()
    entry = _hubs.get(id(loop))
    if entry is None or entry[1].done():
        fanout = Fanout()
        listener = Listener(conninfo(application_name="valka-web-listen"),
                            {TASK_EVENT: fanout.publisher(TASK_EVENT), TASK_LOG: fanout.publisher(TASK_LOG)},
                            on_reconnect=lambda: None)
        fanout.listening = listener.connected
        task = loop.create_task(listener.run(asyncio.Event()))
        _hubs[id(loop)] = entry = (fanout, task)
    return entry[0]
