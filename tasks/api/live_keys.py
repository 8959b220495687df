"""Live API keys remembered by a serving process, forgotten when PostgreSQL says they changed.

Every API call presents a key. Looking it up cost each REST create a statement and a transaction
of its own: about a sixth of the CPU the create took, across the web app and PostgreSQL
(docs/performance.md). So the web app (from its ASGI lifespan) and each dispatcher (from
`run_dispatcher`, for ApiService) remember each live key they find, by its hash, and forget it
when the key changes: a trigger (tasks/sql/schema/api_keys.sql) sends the key's hash on
API_KEY_CHANGED when it is revoked, given another scope, name or hash, or deleted ('*' when the
table is truncated), and a thread of the process LISTENs for that on a connection of its own.

Nothing is remembered while nothing listens: before `start`, until its LISTEN is in place, while
its connection is lost (all is forgotten then, as what was sent meanwhile is lost), and behind a
transaction pooler, through which a LISTEN hears nothing: every look-up then reads the table, as
without this module. A look-up that a notification overtook is not remembered (`_generation`),
so a key revoked while it was being read is not kept. A revoked key is refused from the moment
its notification reaches the process, milliseconds after the revocation commits; and an entry is
read again after `max_age` seconds whatever happens, the bound should a connection die unheard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tasks.notify import API_KEY_CHANGED
from valka.listen import Listener

if TYPE_CHECKING:
    from tasks.models import ApiKey

log = logging.getLogger("valka.live_keys")

MAX_AGE = 60.0  # seconds an entry is trusted without a word from PostgreSQL


class LiveKeys:
    """Live keys by hash, for the threads of one process (`get`), kept by a listener thread (`start`)
    that runs the project's LISTEN connection (valka.listen.Listener) on an event loop of its own."""

    def __init__(self, *, max_age: float = MAX_AGE) -> None:
        self.max_age = max_age
        self._keys: dict[str, tuple[ApiKey, float]] = {}
        self._lock = threading.Lock()
        self._generation = 0  # counts the changes heard and the listener's connections
        self._listener: Listener | None = None
        self._stopping = threading.Event()
        self._stop: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        self._thread: threading.Thread | None = None

    @property
    def listening(self) -> bool:
        """Whether the LISTEN is in place (the Listener's connection up, and not stopped)."""
        return self._listener is not None and self._listener.connected.is_set() and not self._stopping.is_set()

    def get(self, key_hash: str, load: Callable[[str], ApiKey | None]) -> ApiKey | None:
        """The live key with this hash: remembered, or `load(key_hash)` (None when there is none)."""
        if self.listening:
            entry = self._keys.get(key_hash)
            if entry is not None and time.monotonic() - entry[1] < self.max_age:
                return entry[0]
        generation, began = self._generation, time.monotonic()
        record = load(key_hash)
        if record is not None:
            with self._lock:
                if self.listening and self._generation == generation:
                    self._keys[key_hash] = (record, began)
        return record

    def start(self, conninfo: Callable[[], str]) -> None:
        """Start listening, in a daemon thread, on a connection to `conninfo()` (once per process)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stopping.clear()
            self._thread = threading.Thread(target=lambda: asyncio.run(self._run(conninfo())),
                                            name="valka-live-keys", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop listening and forget every key."""
        self._stopping.set()
        with self._lock:
            stop = self._stop
        if stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                stop[0].call_soon_threadsafe(stop[1].set)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)
        self._forget_all()

    def changed(self, payload: str) -> None:
        """A notification: forget the key with that hash, or all of them for '*'."""
        with self._lock:
            self._generation += 1
            if payload == "*":
                self._keys.clear()
            else:
                self._keys.pop(payload, None)

    def _forget_all(self) -> None:
        self.changed("*")

    async def _connected(self, conn: object) -> None:
        """Each new LISTEN connection, before it counts as listening: what was sent while there was
        none is lost, so every key is forgotten (and look-ups under way are not kept)."""
        self._forget_all()

    async def _run(self, dsn: str) -> None:
        from valka.poolers import transaction_pooler

        if await transaction_pooler(dsn):
            log.warning("the LISTEN connection for API keys leads through a transaction pooler: keys are looked up "
                        "on every call (set VALKA_DIRECT_DATABASE_URL to reach PostgreSQL itself)")
            return
        stop = asyncio.Event()
        with self._lock:
            self._stop = (asyncio.get_running_loop(), stop)
            self._listener = Listener(dsn, {API_KEY_CHANGED: self.changed}, on_reconnect=lambda: None,
                                      on_connect=self._connected)
        if self._stopping.is_set():  # stopped before the loop was known
            return
        await self._listener.run(stop)


LIVE_KEYS = LiveKeys()
