"""One LISTEN connection per dispatcher, fanned out to whoever cares.

A notification only wakes things up; after a reconnect everything is
re-checked, since notifications sent while we were away are lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

log = logging.getLogger("valka.listen")


class Listener:
    def __init__(self, conninfo: str, handlers: dict[str, Callable[[str], None]],
                 on_reconnect: Callable[[], None]) -> None:
        self.conninfo = conninfo
        self.handlers = handlers
        self.on_reconnect = on_reconnect
        self.connected = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        backoff = 0.2
        first = True
        while not stop.is_set():
            try:
                async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
                    for channel in self.handlers:
                        await conn.execute(f"LISTEN {channel}")
                    self.connected.set()
                    if not first:
                        log.info("LISTEN connection restored")
                    self.on_reconnect()
                    first, backoff = False, 0.2
                    gen = conn.notifies()
                    stopper = asyncio.ensure_future(stop.wait())
                    try:
                        while True:
                            nxt = asyncio.ensure_future(anext(gen))
                            done, _ = await asyncio.wait({nxt, stopper}, return_when=asyncio.FIRST_COMPLETED)
                            if stopper in done:
                                nxt.cancel()
                                return
                            note = nxt.result()
                            handler = self.handlers.get(note.channel)
                            if handler is not None:
                                handler(note.payload)
                    finally:
                        stopper.cancel()
            except (psycopg.Error, OSError, StopAsyncIteration) as exc:
                self.connected.clear()
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, backoff)
                try:
                    await asyncio.wait_for(stop.wait(), backoff)
                except TimeoutError:
                    pass
                backoff = min(backoff * 2, 5.0)
