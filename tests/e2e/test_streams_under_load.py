"""Open event streams and log tails do not starve the REST API: a stream holds no database
connection between its reads, and a process serves at most VALKA_MAX_STREAMS of them."""

from __future__ import annotations

import asyncio

import httpx
import psycopg

from tests.factories import TaskRunFactory
from tests.helpers import database_url

STREAMS = 50
CREATORS, CREATES_EACH = 8, 25
APP = "valka-web-under-load"  # the web process's connections, as pg_stat_activity names them


async def _open(client: httpx.AsyncClient, path: str, opened: list[str], stop: asyncio.Event) -> int:
    """Reads `path`'s stream until `stop`; answers the task events it saw."""
    seen = 0
    async with client.stream("GET", path) as response:
        assert response.status_code == 200, await response.aread()
        opened.append(path)
        async for line in response.aiter_lines():
            seen += line == "event: task"
            if stop.is_set():
                break
    return seen


def _web_connections() -> int:
    with psycopg.connect(database_url(), autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APP]).fetchone()[0]


def test_streams_leave_the_pool_to_requests(stack):
    run = TaskRunFactory()  # RUNNING: its tails stay open
    base = stack.web(VALKA_DB_POOL="true", VALKA_DB_POOL_MAX="10", VALKA_DB_POOL_TIMEOUT="3", PGAPPNAME=APP)
    peak = 0

    async def scenario() -> tuple[list[int], list[int]]:
        nonlocal peak
        stop, opened = asyncio.Event(), []
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
            readers = [asyncio.create_task(_open(client, "/api/v1/events", opened, stop)) for _ in range(STREAMS)]
            readers += [asyncio.create_task(_open(client, f"/api/v1/tasks/{run.task_id}/runs/{run.id}/logs/stream",
                                                  opened, stop)) for _ in range(STREAMS)]
            while len(opened) < 2 * STREAMS:
                assert not any(r.done() for r in readers), [r.result() for r in readers if r.done()]
                await asyncio.sleep(0.05)

            async def creator(n: int) -> list[int]:
                nonlocal peak
                codes = []
                for i in range(CREATES_EACH):
                    response = await client.post("/api/v1/tasks", json={"task_name": f"load.{n}.{i}", "queue": "q"})
                    codes.append(response.status_code)
                    peak = max(peak, await asyncio.to_thread(_web_connections))
                return codes

            codes = [code for batch in await asyncio.gather(*(creator(n) for n in range(CREATORS))) for code in batch]
            await asyncio.sleep(1.0)  # the last events reach every stream
            stop.set()
            await client.post("/api/v1/tasks", json={"task_name": "wake", "queue": "q"})  # a line for each to see stop
            seen = await asyncio.wait_for(asyncio.gather(*readers[:STREAMS]), 30)
            for reader in readers[STREAMS:]:
                reader.cancel()
            return codes, seen

    codes, seen = asyncio.run(scenario())
    assert codes == [201] * CREATORS * CREATES_EACH
    assert min(seen) >= CREATORS * CREATES_EACH, "every event stream saw every create"
    # The pool's ten, plus the one LISTEN connection that feeds every stream of the process.
    assert 0 < peak <= 11


def test_a_stream_past_the_cap_is_a_clear_503(stack):
    base = stack.web(VALKA_MAX_STREAMS="3")

    async def scenario() -> httpx.Response:
        stop, opened = asyncio.Event(), []
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            readers = [asyncio.create_task(_open(client, "/api/v1/events", opened, stop)) for _ in range(3)]
            while len(opened) < 3:
                await asyncio.sleep(0.05)
            refused = await client.get("/api/v1/events")
            for reader in readers:
                reader.cancel()
            return refused

    refused = asyncio.run(scenario())
    assert refused.status_code == 503 and refused.headers["Retry-After"]
    assert refused.json()["error"] == "UNAVAILABLE" and "VALKA_MAX_STREAMS" in refused.json()["message"]


def test_a_burst_of_streams_gets_exactly_the_cap_and_closed_ones_free_their_place(stack):
    base = stack.web(VALKA_MAX_STREAMS="5")

    async def scenario() -> tuple[list[int], int]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
            async def attempt() -> tuple[int, httpx.Response]:
                request = client.build_request("GET", "/api/v1/events")
                response = await client.send(request, stream=True)
                return response.status_code, response

            answers = await asyncio.gather(*(attempt() for _ in range(20)))
            for _, response in answers:
                await response.aclose()  # every stream leaves: their places are free again
            await asyncio.sleep(0.5)
            again = await asyncio.gather(*(attempt() for _ in range(5)))
            for _, response in again:
                await response.aclose()
            return sorted(code for code, _ in answers), sum(code == 200 for code, _ in again)

    codes, reopened = asyncio.run(scenario())
    assert codes == [200] * 5 + [503] * 15
    assert reopened == 5
