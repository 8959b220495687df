"""Live API keys remembered by a serving process, forgotten when PostgreSQL says they changed.

Every API call presents a key. Looking it up cost each REST create a statement and a transaction
of its own: about a sixth of the CPU the create took, across the web app and PostgreSQL
(docs/performance.md). So the web app (from its ASGI lifespan) and each dispatcher (from
`run_dispatcher`, for ApiService) remember each live key they find, by its hash, and forget it
when the key changes: a trigger (tasks/sql/schema/api_keys.sql) sends the key's hash on
API_KEY_CHANGED when it is revoked, given another scope, name or hash, or deleted ('*' when the
table is truncated), and a thread of the process LISTENs for that on a connection of its own.

That connection is open only while keys are looked up: the first look-up after `start` opens it,
and it closes `linger` seconds after the last one. PostgreSQL wakes every session that LISTENs in
a database at every NOTIFY sent there, whatever its channel: an idle listener would cost each new
task's commit a process to wake on a busy core (docs/performance.md, "Latency: waking processes").

Nothing is remembered while nothing listens: before `start`, until its LISTEN is in place, while
its connection is lost (all is forgotten then, as what was sent meanwhile is lost), once it has
closed for want of look-ups, and behind a transaction pooler, through which a LISTEN hears
nothing: every look-up then reads the table, as without this module. A look-up that a
notification overtook is not remembered (`_generation`), so a key revoked while it was being read
is not kept. A revoked key is refused from the moment its notification reaches the process,
milliseconds after the revocation commits; and an entry is read again after `max_age` seconds
whatever happens, the bound should a connection die unheard.

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
LINGER = 60.0  # seconds the LISTEN connection stays open after the last look-up
WAIT = 5.0  # seconds `stop` waits for the listener's thread to end


class LiveKeys:
    """Live keys by hash, for the threads of one process (`get`), kept by a listener thread that
    the look-ups open once `start` allows it."""

    def __init__(self, *, max_age: float = MAX_AGE, linger: float = LINGER) -> None:
        self.max_age = max_age
        self.linger = linger
        self._keys: dict[str, tuple[ApiKey, float]] = {}
        self._lock = threading.Lock()
        self._generation = 0  # counts the changes heard and the listener's comings and goings
        self._listening = False
        self._conninfo: Callable[[], str] | None = None  # set by `start`: the listener may open
        self._pooled = False  # the connection leads through a transaction pooler: never listen
        self._used = 0.0  # when a key was last looked up (time.monotonic)
        self._stop = threading.Event()
        self._wake: Callable[[], None] | None = None  # ends the listener's loop from another thread
        self._thread: threading.Thread | None = None  # the listener's, until it has ended
        self._again = False  # a look-up came while the listener was not listening: listen again

    @property
    def listening(self) -> bool:
        return self._listening

    def remembered(self, key_hash: str) -> ApiKey | None:
        """The live key with this hash if this process remembers it, else None: no look-up, for a
        caller that must not wait on the database (the REST create on the event loop)."""
        self._used = now = time.monotonic()
        if self._listening:
            entry = self._keys.get(key_hash)
            if entry is not None and now - entry[1] < self.max_age:
                return entry[0]
        return None

    def get(self, key_hash: str, load: Callable[[str], ApiKey | None]) -> ApiKey | None:
        """The live key with this hash: remembered, or `load(key_hash)` (None when there is none)."""
        record = self.remembered(key_hash)
        if record is not None:
            return record
        if not self._listening:
            self.listen()
        generation, began = self._generation, time.monotonic()
        record = load(key_hash)
        if record is not None:
            with self._lock:
                if self._listening and self._generation == generation:
                    self._keys[key_hash] = (record, began)
        return record

    def start(self, conninfo: Callable[[], str]) -> None:
        """Let this process listen, on a connection to `conninfo()`, from the next look-up on."""
        with self._lock:
            self._conninfo = conninfo
            self._stop.clear()

    def listen(self) -> None:
        """Open the listener now (in a daemon thread) if `start` allows it and none is open: what a
        look-up of a key not remembered does."""
        with self._lock:
            if self._conninfo is None or self._pooled or self._stop.is_set():
                return
            self._used = time.monotonic()
            if self._thread is not None:
                # Still connecting, or ending after `linger`: an ending one starts again rather
                # than leave this look-up's key unheard until the next miss.
                self._again = True
                return
            self._again = False
            self._thread = threading.Thread(target=self._run, args=(self._conninfo,), name="valka-live-keys",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop listening until `start` again and forget every key (waits up to WAIT seconds for the
        thread to end)."""
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
            if listening:
                self._again = False

    def _run(self, conninfo: Callable[[], str]) -> None:
        try:
            self._listen_while_wanted(conninfo)
        finally:
            with self._lock:
                if self._thread is threading.current_thread():  # it ended early (a pooler, an error)
                    self._thread = None

    def _listen_while_wanted(self, conninfo: Callable[[], str]) -> None:
        from valka.poolers import transaction_pooler

        dsn = conninfo()
        if asyncio.run(transaction_pooler(dsn)):
            self._pooled = True
            log.warning("the LISTEN connection for API keys leads through a transaction pooler: keys are looked up "
                        "on every call (set VALKA_DIRECT_DATABASE_URL to reach PostgreSQL itself)")
            return
        while True:
            try:
                asyncio.run(self._listen(dsn))
            finally:
                self._wake = None
                self._set_listening(False)
            with self._lock:  # decided with `listen`'s lock held: no look-up slips in between
                if not self._again or self._stop.is_set():
                    self._thread = None
                    return
                self._again = False

    async def _listen(self, dsn: str) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._wake = lambda: loop.call_soon_threadsafe(stop.set)
        if self._stop.is_set():  # stopped before `_wake` was there to be called
            return

        async def connected(_conn: psycopg.AsyncConnection) -> None:
            self._set_listening(True)

        idle = asyncio.create_task(self._close_when_idle(stop))
        try:
            await Listener(dsn, {API_KEY_CHANGED: self.changed}, on_reconnect=lambda: None, on_connect=connected,
                           on_lost=lambda: self._set_listening(False), logger=log).run(stop)
        finally:
            idle.cancel()

    async def _close_when_idle(self, stop: asyncio.Event) -> None:
        """End the listener `linger` seconds after the last look-up, forgetting every key first, so
        that nothing is remembered past the moment the connection stops hearing."""
        while (idle := time.monotonic() - self._used) < self.linger:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.linger - idle)
            if stop.is_set():
                return
        self._set_listening(False)
        stop.set()


LIVE_KEYS = LiveKeys()
