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

The thread runs the processes' common LISTEN loop (valka.listen.Listener) on an event loop of its
own: it serves a web process's threads, whichever loop they run on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg

from tasks.notify import API_KEY_CHANGED
from valka.listen import Listener

if TYPE_CHECKING:
    from tasks.models import ApiKey

log = logging.getLogger("valka.live_keys")

MAX_AGE = 60.0  # seconds an entry is trusted without a word from PostgreSQL
WAIT = 5.0  # seconds `stop` waits for the listener's thread to end


class LiveKeys:
    """Live keys by hash, for the threads of one process (`get`), kept by a listener thread (`start`)."""

    def __init__(self, *, max_age: float = MAX_AGE) -> None:
        self.max_age = max_age
        self._keys: dict[str, tuple[ApiKey, float]] = {}
        self._lock = threading.Lock()
        self._generation = 0  # counts the changes heard and the listener's comings and goings
        self._listening = False
        self._stop = threading.Event()
        self._wake: Callable[[], None] | None = None  # ends the listener's loop from another thread
        self._thread: threading.Thread | None = None

    @property
    def listening(self) -> bool:
        return self._listening

    def remembered(self, key_hash: str) -> ApiKey | None:
        """The live key with this hash if this process remembers it, else None: no look-up, for a
        caller that must not wait on the database (the REST create on the event loop)."""
        if self._listening:
            entry = self._keys.get(key_hash)
            if entry is not None and time.monotonic() - entry[1] < self.max_age:
                return entry[0]
        return None

    def get(self, key_hash: str, load: Callable[[str], ApiKey | None]) -> ApiKey | None:
        """The live key with this hash: remembered, or `load(key_hash)` (None when there is none)."""
        record = self.remembered(key_hash)
        if record is not None:
            return record
        generation, began = self._generation, time.monotonic()
        record = load(key_hash)
        if record is not None:
            with self._lock:
                if self._listening and self._generation == generation:
                    self._keys[key_hash] = (record, began)
        return record

    def start(self, conninfo: Callable[[], str]) -> None:
        """Start listening, in a daemon thread, on a connection to `conninfo()` (once per process)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, args=(conninfo,), name="valka-live-keys", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop listening and forget every key (waits up to WAIT seconds for the thread to end)."""
        self._stop.set()
        if (wake := self._wake) is not None:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile: the thread is ending
                wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(WAIT)

    def changed(self, payload: str) -> None:
        """A notification: forget the key with that hash, or all of them for '*'."""
        with self._lock:
            self._generation += 1
            if payload == "*":
                self._keys.clear()
            else:
                self._keys.pop(payload, None)

    def _set_listening(self, listening: bool) -> None:
        with self._lock:
            self._generation += 1
            self._keys.clear()
            self._listening = listening

    def _run(self, conninfo: Callable[[], str]) -> None:
        from valka.poolers import transaction_pooler

        dsn = conninfo()
        if asyncio.run(transaction_pooler(dsn)):
            log.warning("the LISTEN connection for API keys leads through a transaction pooler: keys are looked up "
                        "on every call (set VALKA_DIRECT_DATABASE_URL to reach PostgreSQL itself)")
            return
        try:
            asyncio.run(self._listen(dsn))
        finally:
            self._wake = None
            self._set_listening(False)

    async def _listen(self, dsn: str) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._wake = lambda: loop.call_soon_threadsafe(stop.set)
        if self._stop.is_set():  # stopped before `_wake` was there to be called
            return

        async def connected(_conn: psycopg.AsyncConnection) -> None:
            self._set_listening(True)

        await Listener(dsn, {API_KEY_CHANGED: self.changed}, on_reconnect=lambda: None, on_connect=connected,
                       on_lost=lambda: self._set_listening(False), logger=log).run(stop)


LIVE_KEYS = LiveKeys()
