"""Helpers for the scheduler tests: async connections to the test database, one-pass
runs of a loop, a LISTEN connection, and the database clock.

The loops run on their own psycopg connections, so the rows a test builds
with the factories must be committed: every test here uses
`django_db(transaction=True)`. ORM calls stay outside `asyncio.run`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest
from django.db import connection

from tasks.retry import RetryPolicy
from tasks.scheduler.base import Loop, SchedulerConfig
from tests.helpers import database_url
from valka.db import conninfo


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts real scheduler processes (a few seconds each)")


def make_config(**overrides: Any) -> SchedulerConfig:
    values: dict[str, Any] = {
        "batch_size": 500, "max_sleep": 1.0, "reaper_interval": 30.0, "dispatching_timeout": 60.0,
        "worker_timeout": 120.0, "retention_interval": 600.0, "retention_days": 7.0,
        "dead_letter_retention_days": 30.0,
        "retry_params": RetryPolicy(base_delay=1.0, max_delay=3600.0, jitter=0.25).sql_params(),
    }
    values.update(overrides)
    return SchedulerConfig(**values)


async def connect(name: str = "valka-tests") -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(conninfo(application_name=name), autocommit=True)


def once(loop: Loop, now: datetime | None = None) -> int:
    """One `run_once` of `loop` on a fresh connection."""

    async def go() -> int:
        async with await connect() as conn:
            return await loop.run_once(conn, now)

    return asyncio.run(go())


def run_async(fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(fn())


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


class Listener:
    """A separate connection LISTENing on a channel; `drain()` returns the payloads it received."""

    def __init__(self, channel: str) -> None:
        self.conn = psycopg.connect(database_url(), autocommit=True)
        self.conn.execute(f"LISTEN {channel}")

    def drain(self, expect: int, timeout: float = 10.0) -> list[str]:
        """The payloads received: `expect` of them (waiting up to `timeout`), plus any
        that arrive within a short grace period after, so extra ones are seen too."""
        got = [n.payload for n in self.conn.notifies(timeout=timeout, stop_after=expect)] if expect else []
        return got + [n.payload for n in self.conn.notifies(timeout=0.2)]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def listen():
    opened: list[Listener] = []

    def start(channel: str = "valka_task_ready") -> Listener:
        opened.append(Listener(channel))
        return opened[-1]

    yield start
    for listener in opened:
        listener.close()
