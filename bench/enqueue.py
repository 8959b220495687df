"""Enqueue throughput on Valka: in process, REST (single and batch) and gRPC CreateTask.

No worker serves ENQUEUE_QUEUE, so the tasks stay PENDING; `cleanup()` deletes them
so the later workloads start from the same table.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from bench.measure import bar

ENQUEUE_QUEUE = "enqueue"


def _result(count: int, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"rate_per_s": count / seconds, "count": count, "seconds": seconds, **extra}


def in_process(count: int, threads: int = 1) -> dict[str, Any]:
    """`valka.enqueue` in a loop, one task and one commit per call, from `threads` threads."""
    from django.db import connection

    import valka

    per_thread = count // threads
    errors: list[BaseException] = []
    with bar(per_thread * threads, f"enqueue in-process x{threads}") as progress:
        def run() -> None:
            try:
                for i in range(per_thread):
                    valka.enqueue("noop", queue=ENQUEUE_QUEUE, input={"i": i})
                    progress.update(1)
            except BaseException as exc:  # re-raised below
                errors.append(exc)
            finally:
                if threads > 1:
                    connection.close()

        start = time.perf_counter()
        if threads == 1:
            run()
        else:
            pool = [threading.Thread(target=run) for _ in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
        seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    return _result(per_thread * threads, seconds, threads=threads)


def in_process_in_turns(count: int, *, floor_url: str, database_url: str, rounds: int = 3,
                        peers: Mapping[str, Callable[[int], float]] | None = None) -> dict[str, Any]:
    """`in_process(count)` in turns with the two single-caller figures it is held to
    (bench/floor.py): the bare INSERT + commit in `floor_url`'s database, and the tasks table's own
    INSERT + NOTIFY in `database_url`'s, round by round; and with each of `peers`' own enqueue
    (name → a round's rate for `count` tasks), compared with Valka's in the same way. Measured
    minutes apart, at the start and the end of a run, their ratio measured the machine's drift as
    much as the code. Each figure is the median of its rounds."""
    from bench import floor

    peers = peers or {}
    rates: dict[str, list[float]] = {"valka": [], "floor": [], "tasks_table": [], **{name: [] for name in peers}}
    for _ in range(rounds):
        rates["floor"].append(floor.enqueue_single(floor_url, count)["rate_per_s"])
        rates["tasks_table"].append(floor.enqueue_tasks_table(database_url, count)["rate_per_s"])
        rates["valka"].append(in_process(count)["rate_per_s"])
        for name, enqueue in peers.items():
            rates[name].append(enqueue(count))
    return {side: {"rate_per_s": statistics.median(figures), "rounds": figures, "count": count}
            for side, figures in rates.items()}


def rest_single_in_turns(url: str, api_key: str, count: int, *, floor_url: str, web_floor_url: str | None = None,
                         rounds: int = 3) -> dict[str, Any]:
    """`rest_single` in turns with the 8-caller INSERT + commit floors (bench/floor.py), with and
    without a NOTIFY, in `floor_url`'s database, and with the web floor served at `web_floor_url`
    (bench/web_floor.py) when given, round by round, for the reason `in_process_in_turns` gives.
    Each figure is the median of its rounds."""
    from bench import floor

    rates: dict[str, list[float]] = {"rest_x8": [], "enqueue_x8_notify": [], "enqueue_x8": []}
    if web_floor_url:
        rates["web_x8"] = []
    for _ in range(rounds):
        rates["enqueue_x8_notify"].append(floor.enqueue_concurrent(floor_url, notify=True)["rate_per_s"])
        rates["enqueue_x8"].append(floor.enqueue_concurrent(floor_url, notify=False)["rate_per_s"])
        if web_floor_url:
            rates["web_x8"].append(rest_single(web_floor_url, "", count, path="/", label="web floor")["rate_per_s"])
        rates["rest_x8"].append(rest_single(url, api_key, count)["rate_per_s"])
    return {side: {"rate_per_s": statistics.median(figures), "rounds": figures, "callers": 8}
            for side, figures in rates.items()}


def rest_single(url: str, api_key: str, count: int, clients: int = 8, *, path: str = "/api/v1/tasks",
                label: str = "enqueue REST") -> dict[str, Any]:
    """POST `path` (the REST create) from `clients` concurrent keep-alive connections, each
    sending its next request when its answer is in (bench/http_load.py: the client costs the two
    shared cores as little as a client can)."""
    from bench import http_load

    headers = {"Accept": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
    per_client = count // clients

    def requests(client: int) -> Iterator[bytes]:
        for i in range(per_client):
            body = json.dumps({"task_name": "noop", "queue": ENQUEUE_QUEUE, "input": {"i": client * per_client + i}})
            yield http_load.post_request(url, path, body.encode(), headers)

    with bar(per_client * clients, f"{label} x{clients}") as progress:
        seconds = http_load.run(url, requests, connections=clients, answered=lambda: progress.update(1))
    return _result(per_client * clients, seconds, clients=clients)


def rest_batch(url: str, api_key: str, batches: int, size: int = 1000) -> dict[str, Any]:
    """POST /api/v1/tasks/batch with `size` tasks per call, one call after another."""
    headers = {"Authorization": f"Bearer {api_key}"}
    body = {"tasks": [{"task_name": "noop", "queue": ENQUEUE_QUEUE, "input": {"i": i}} for i in range(size)]}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as http, \
            bar(batches * size, f"enqueue REST batch of {size}") as progress:
        http.get("/healthz")
        start = time.perf_counter()
        for _ in range(batches):
            r = http.post("/api/v1/tasks/batch", json=body)
            r.raise_for_status()
            progress.update(size)
        seconds = time.perf_counter() - start
    return _result(batches * size, seconds, batch_size=size)


def grpc_single(addr: str, key: str, count: int, clients: int = 8) -> dict[str, Any]:
    """ApiService/CreateTask from `clients` concurrent callers on one channel, each call with the
    API `key` (metadata `authorization`), as a deployed dispatcher requires."""
    import grpc

    from valka_sdk.v1 import api_pb2, api_pb2_grpc

    async def main() -> float:
        async with grpc.aio.insecure_channel(addr) as channel:
            stub = api_pb2_grpc.ApiServiceStub(channel)
            auth = (("authorization", f"Bearer {key}"),)
            per_client = count // clients
            with bar(per_client * clients, f"enqueue gRPC x{clients}") as progress:
                async def client() -> None:
                    for i in range(per_client):
                        await stub.CreateTask(api_pb2.CreateTaskRequest(
                            queue_name=ENQUEUE_QUEUE, task_name="noop", input=f'{{"i": {i}}}'), metadata=auth)
                        progress.update(1)

                await channel.channel_ready()
                start = time.perf_counter()
                await asyncio.gather(*(client() for _ in range(clients)))
                return time.perf_counter() - start

    seconds = asyncio.run(main())
    return _result(count // clients * clients, seconds, clients=clients)


def cleanup(database_url: str) -> None:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM tasks WHERE queue = %s", (ENQUEUE_QUEUE,))
        conn.execute("VACUUM ANALYZE tasks")
