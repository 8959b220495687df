"""A transaction-mode connection pooler for the tests, speaking just enough of PostgreSQL's protocol.

PgBouncer is not on a fresh machine, and `make test` must pass on one. This pooler behaves as
PgBouncer in transaction mode does where it matters to Valka: it answers each client's start-up
itself, and lends one of its server connections (opened to the real PostgreSQL, which trusts
local connections) to a client from the client's first message until the server is ready for a
query outside a transaction; then it takes it back, and lends the most recently returned first.
So whatever a session keeps (LISTEN, advisory locks, SET, prepared statements) stays with the
server connection, for the next client to find, as it does behind PgBouncer.

Left out: authentication, TLS (refused, so clients go on in plain text), cancel requests
(dropped), and PgBouncer's tracking of prepared statements and of some parameters.

    with Pooler.to(database_url()) as pooler:
        psycopg.connect(pooler.url)
"""

from __future__ import annotations

import asyncio
import struct
import threading
from urllib.parse import urlsplit

from valka.devdb import free_port

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
PROTOCOL_3 = 196608
ANSWERED_BY_READY = (b"Q", b"S", b"F")  # client messages the server answers with a ReadyForQuery


def message(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(payload) + 4) + payload


async def read_message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The next message: its type and all of its bytes."""
    head = await reader.readexactly(5)
    (length,) = struct.unpack("!I", head[1:])
    return head[:1], head + await reader.readexactly(length - 4)


def _strings(*values: str) -> bytes:
    return b"".join(v.encode() + b"\0" for v in values)


class Server:
    """One connection to PostgreSQL, lent to one client at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.client: Client | None = None
        self.unanswered = 0  # messages of the client's whose ReadyForQuery has not come back yet
        self.alive = True


class Client:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.server: Server | None = None


class Pooler:
    """Listens on 127.0.0.1:`port` and pools at most `size` connections to `host`:`server_port`.

    `fifo`: lend the longest idle connection first (PgBouncer's server_round_robin) instead of the
    most recently returned; `warm`: open that many connections at the start (its min_pool_size)."""

    def __init__(self, *, host: str, server_port: int, user: str, dbname: str, size: int = 10,
                 fifo: bool = False, warm: int = 0) -> None:
        self.host, self.server_port, self.user, self.dbname, self.size = host, server_port, user, dbname, size
        self.fifo, self.warm = fifo, warm
        self.port = free_port()
        self.opened = 0  # server connections opened, over the pooler's life
        self.idle: list[Server] = []
        self._open_servers = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._params: list[bytes] = []  # the ParameterStatus messages PostgreSQL sent us, for our clients
        self._servers: set[Server] = set()
        self._clients: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-pooler", daemon=True)
        self._listening: asyncio.Server | None = None

    @classmethod
    def to(cls, url: str, **kwargs: int | bool) -> Pooler:
        parts = urlsplit(url)
        return cls(host=parts.hostname or "127.0.0.1", server_port=parts.port or 5432, user=parts.username or "",
                   dbname=parts.path.lstrip("/"), **kwargs)

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.dbname}"

    def __enter__(self) -> Pooler:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _listen(self) -> None:
        for server in [await self._acquire() for _ in range(self.warm)]:
            self._release(server)
        self._listening = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _close(self) -> None:
        if self._listening is not None:
            self._listening.close()
        for writer in [*self._clients, *(s.writer for s in self._servers)]:
            writer.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- Server connections. --

    async def _open(self) -> Server:
        reader, writer = await asyncio.open_connection(self.host, self.server_port)
        body = struct.pack("!I", PROTOCOL_3) + _strings("user", self.user, "database", self.dbname,
                                                        "application_name", "valka-test-pooler") + b"\0"
        writer.write(struct.pack("!I", len(body) + 4) + body)
        params = []
        while True:
            kind, msg = await read_message(reader)
            if kind == b"R" and msg[5:9] != b"\0\0\0\0":
                raise ConnectionError("the test pooler only knows trust authentication")
            if kind == b"E":
                raise ConnectionError(msg[5:].replace(b"\0", b" ").decode(errors="replace"))
            if kind == b"S":
                params.append(msg)
            if kind == b"Z":
                break
        self._params = self._params or params
        self.opened += 1
        server = Server(reader, writer)
        self._servers.add(server)
        asyncio.get_running_loop().create_task(self._relay(server))
        return server

    async def _acquire(self) -> Server:
        while True:
            while self.idle:
                server = self.idle.pop(0 if self.fifo else -1)  # PgBouncer's default: the last returned
                if server.alive:
                    return server
            if self._open_servers < self.size:
                self._open_servers += 1
                try:
                    return await self._open()
                except BaseException:
                    self._open_servers -= 1
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _release(self, server: Server) -> None:
        server.client = None
        server.unanswered = 0
        self.idle.append(server)
        self._wake_one()

    def _drop(self, server: Server) -> None:
        if server.alive:
            server.alive = False
            self._open_servers -= 1
            self._servers.discard(server)
            server.writer.close()
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _relay(self, server: Server) -> None:
        """Everything the server says goes to the client it is lent to (to nobody while idle: a
        notification for a LISTEN of an earlier client is lost, as behind PgBouncer). A ReadyForQuery
        outside a transaction that answers the client's last message ends the loan."""
        try:
            while True:
                kind, msg = await read_message(server.reader)
                client = server.client
                if client is None:
                    continue
                client.writer.write(msg)
                if kind == b"Z":
                    server.unanswered -= 1
                    if server.unanswered <= 0 and msg[5:6] == b"I":
                        client.server = None
                        self._release(server)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            if server.client is not None:
                server.client.writer.close()
            self._drop(server)

    # -- Clients. --

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.add(writer)
        client = Client(writer)
        try:
            if not await self._start_up(reader, writer):
                return
            while True:
                kind, msg = await read_message(reader)
                if kind == b"X":
                    return
                if client.server is None:
                    client.server = await self._acquire()
                    client.server.client = client
                if kind in ANSWERED_BY_READY:
                    client.server.unanswered += 1
                client.server.writer.write(msg)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            if client.server is not None:  # gone within a transaction: the session is not fit to lend
                self._drop(client.server)
            self._clients.discard(writer)
            writer.close()

    async def _start_up(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer the client's start-up as PostgreSQL would, with the parameters it reported to us."""
        while True:
            (length,) = struct.unpack("!I", await reader.readexactly(4))
            body = await reader.readexactly(length - 4)
            (code,) = struct.unpack("!I", body[:4])
            if code in (SSL_REQUEST, GSSENC_REQUEST):
                writer.write(b"N")
                continue
            if code != PROTOCOL_3:
                return False  # a cancel request: not supported
            break
        if not self._params:
            try:
                self._release(await self._acquire())
            except (ConnectionError, OSError) as exc:
                writer.write(message(b"E", b"SFATAL\0C08006\0M" + f"test pooler: {exc}".encode() + b"\0\0"))
                return False
        writer.write(message(b"R", struct.pack("!I", 0)) + b"".join(self._params)
                     + message(b"K", struct.pack("!II", 1, 1)) + message(b"Z", b"I"))
        return True

