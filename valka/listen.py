"""One LISTEN connection per dispatcher, fanned out to whoever cares.

A notification only wakes things up; after a reconnect everything is
re-checked, since notifications sent while we were away are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import psycopg

from valka.db import next_retry_wait

log = logging.getLogger("valka.listen")


Hook = Callable[[psycopg.AsyncConnection], Awaitable[object]]


class Listener:
    """`on_connect` runs on each new connection after its LISTENs, before `connected` is set;
    `on_stop` runs on the connection when `stop` ends the listener (not when it is lost);
    `on_lost` runs when a connection is lost or cannot be made, before the wait to try again."""

    def __init__(self, conninfo: str, handlers: dict[str, Callable[[str], None]],
                 on_reconnect: Callable[[], None], *, on_connect: Hook | None = None,
                 on_stop: Hook | None = None, on_lost: Callable[[], None] | None = None,
                 logger: logging.Logger = log) -> None:
        self.conninfo = conninfo
        self.handlers = handlers
        self.on_reconnect = on_reconnect
        self.on_connect = on_connect
        self.on_stop = on_stop
        self.on_lost = on_lost
        self.log = logger
        self.connected = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        backoff = 0.2
        first = True
        while not stop.is_set():
            try:
                async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
                    for channel in self.handlers:
                        await conn.execute(f"LISTEN {channel}")
                    if self.on_connect is not None:
                        await self.on_connect(conn)
                    self.connected.set()
                    if not first:
                        self.log.info("LISTEN connection restored")
                    self.on_reconnect()
                    first, backoff = False, 0.2
                    reader = asyncio.ensure_future(self._read(conn))
                    stopper = asyncio.ensure_future(stop.wait())
                    try:
                        await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
                        if reader.done():
                            reader.result()  # the connection failed: raises
                            raise StopAsyncIteration
                        reader.cancel()
                        if self.on_stop is not None:
                            await asyncio.wait({reader})  # it stops reading the socket first
                            with contextlib.suppress(psycopg.Error, OSError):
                                await self.on_stop(conn)
                        return
                    finally:
                        stopper.cancel()
                        reader.cancel()
            except (psycopg.Error, OSError, StopAsyncIteration) as exc:
                self.connected.clear()
                if self.on_lost is not None:
                    self.on_lost()
                self.log.warning("LISTEN connection lost (%s); reconnecting in %.1fs",
                                 " ".join(str(exc).split()) or type(exc).__name__, backoff)
                try:
                    await asyncio.wait_for(stop.wait(), backoff)
                except TimeoutError:
                    pass
                backoff = next_retry_wait(backoff)

    async def _read(self, conn: psycopg.AsyncConnection) -> None:
        """Hand each notification to its channel's handler for as long as the connection lives;
        raises when it is lost.

        The event loop calls back when the socket has data, and libpq's own calls take the
        notifications off it. psycopg's `notifies()` generator, which this replaces, set up and
        tore down a wait around each notification, and every dispatcher of a database hears every
        new task's NOTIFY, those of queues it does not serve included: beside an idle dispatcher,
        that cost a producer about 0.03 ms per task (docs/performance.md, "Enqueue, one task per
        commit")."""
        pgconn, encoding = conn.pgconn, conn.info.encoding
        loop = asyncio.get_running_loop()
        lost: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            try:
                pgconn.consume_input()
                while (note := pgconn.notifies()) is not None:
                    handler = self.handlers.get(note.relname.decode(encoding))
                    if handler is not None:
                        handler(note.extra.decode(encoding))
            except Exception as exc:  # the connection is lost (psycopg.OperationalError), or a handler failed
                # At once: libpq may have closed the socket, and a connection opened later in this
                # process may get its number, whose reader would be removed in its stead.
                unwatch()
                if not lost.done():
                    lost.set_exception(exc)

        fd = pgconn.socket  # kept: libpq closes the socket when the connection is lost

        def unwatch() -> None:
            with contextlib.suppress(OSError, ValueError):
                loop.remove_reader(fd)

        loop.add_reader(fd, readable)
        try:
            readable()  # what came while the LISTENs ran
            await lost
        finally:
            if not lost.done():  # stopped or cancelled: the connection, and its socket, are still open
                unwatch()
