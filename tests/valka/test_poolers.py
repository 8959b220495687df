"""Valka behind a transaction pooler (tests/pooler.py, which lends server sessions as PgBouncer in
transaction mode does): the look for one (valka.poolers), the processes that refuse to start
through one, and the stack that runs with VALKA_DIRECT_DATABASE_URL beside it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time

import psycopg
import pytest
from django.db import connection, connections
from django.test import override_settings
from psycopg.conninfo import conninfo_to_dict

from dispatcher.node import DispatcherNode, NodeSettings
from tasks import live
from tasks.api.auth import api_key_create
from tasks.api.live_keys import LiveKeys
from tasks.models import Task
from tasks.notify import TASK_EVENT
from tests.helpers import ROOT, Stack, database_url, no_event_watchers_left, wait_for, wait_status
from tests.pooler import Pooler
from valka.conf import valka_settings
from valka.db import conninfo, make_pool
from valka.poolers import transaction_pooler
from valka_sdk import Client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pooler():
    with Pooler.to(database_url()) as running:
        yield running


@pytest.fixture(params=[{"size": 1}, {"size": 4}, {"size": 4, "fifo": True, "warm": 4}],
                ids=["one session", "last returned first", "longest idle first"])
def poolers(request):
    with Pooler.to(database_url(), **request.param) as running:
        yield running


def _direct(url: str) -> dict:
    return {**valka_settings.all(), "DIRECT_DATABASE_URL": url}


# -- The look. --

def test_the_look_finds_the_pooler_and_not_postgresql_itself(poolers):
    assert asyncio.run(transaction_pooler(poolers.url)) is True
    assert asyncio.run(transaction_pooler(database_url())) is False


def test_the_look_gives_up_at_once_when_nothing_listens():
    began = time.monotonic()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert asyncio.run(transaction_pooler(f"postgresql://valka@127.0.0.1:{port}/valka")) is None
    assert time.monotonic() - began < 3


def test_the_look_gives_up_within_its_time_when_nothing_answers():
    with socket.socket() as silent:  # accepts connections (the kernel does), never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        began = time.monotonic()
        found = asyncio.run(transaction_pooler(f"postgresql://valka@127.0.0.1:{silent.getsockname()[1]}/valka",
                                               timeout=0.5))
        assert found is None and time.monotonic() - began < 2


# -- The connections that need a session. --

def test_only_connections_that_need_a_session_take_the_direct_url():
    with override_settings(VALKA=_direct("postgres://other:secret@db-direct.internal:6432/valka_direct"
                                         "?sslmode=require")):
        direct = conninfo_to_dict(conninfo(application_name="x", direct=True))
        pooled = conninfo_to_dict(conninfo(application_name="x"))
    assert (direct["host"], direct["port"], direct["dbname"], direct["user"], direct["sslmode"]) == (
        "db-direct.internal", "6432", "valka_direct", "other", "require")
    ours = connection.settings_dict
    assert (pooled["port"], pooled["dbname"]) == (str(ours["PORT"]), ours["NAME"])
    # Without the setting, the connections that need a session take DATABASE_URL like the others.
    assert conninfo(application_name="x", direct=True) == conninfo(application_name="x")


def test_a_pool_through_a_pooler_prepares_nothing_when_prepared_statements_are_off(pooler, monkeypatch):
    """psycopg prepares a statement run often on a connection; behind a pooler that cannot keep
    prepared statements, the next run lands on a session that never saw it prepared."""
    settings = connections.databases["default"]
    monkeypatch.setitem(settings, "HOST", "127.0.0.1")
    monkeypatch.setitem(settings, "PORT", pooler.port)
    monkeypatch.delitem(settings["OPTIONS"], "prepare_threshold", raising=False)  # VALKA_DB_PREPARED_STATEMENTS=false

    async def scenario() -> list[int]:
        pool = make_pool("prepared-behind-a-pooler", min_size=1, max_size=1)
        other = await psycopg.AsyncConnection.connect(pooler.url, autocommit=True)
        await pool.open()
        try:
            seen = []
            for i in range(12):
                async with contextlib.AsyncExitStack() as held:
                    if i % 2:  # the other client holds the session the pool's client used last
                        await held.enter_async_context(other.transaction())
                    async with pool.connection() as conn:
                        cur = await conn.execute("SELECT %s::int + 1", [i])
                        seen.append((await cur.fetchone())[0])
            return seen
        finally:
            await pool.close()
            await other.close()

    assert asyncio.run(scenario()) == list(range(1, 13))


def test_the_dispatchers_plan_settings_stay_in_sessions_of_their_own(monkeypatch):
    """The dispatcher's pools set plan settings for their sessions (dispatcher/sql.py). Through a
    pooler of one server session, a SET there would reach the next client that borrows it."""
    settings = connections.databases["default"]
    shown = "SELECT current_setting('enable_seqscan'), current_setting('enable_hashjoin')"

    async def scenario() -> dict:
        node = DispatcherNode(NodeSettings(node_id="pooled", lease_extension=60, poll_interval=1,
                                           shutdown_timeout=1, worker_token=""))
        await node.pool.open()
        await node.claim_pool.open()
        try:
            async with node.pool.connection() as writes, node.claim_pool.connection() as claims:
                seen = {"writes": await (await writes.execute(shown)).fetchone(),
                        "claims": await (await claims.execute(shown)).fetchone()}
            async with await psycopg.AsyncConnection.connect(pooler.url, autocommit=True) as other:
                seen["other client"] = await (await other.execute(shown)).fetchone()
            return seen
        finally:
            await node.claim_pool.close()
            await node.pool.close()

    with Pooler.to(database_url(), size=1) as pooler, override_settings(VALKA=_direct(database_url())):
        monkeypatch.setitem(settings, "HOST", "127.0.0.1")
        monkeypatch.setitem(settings, "PORT", pooler.port)
        seen = asyncio.run(scenario())
    assert seen == {"writes": ("off", "on"), "claims": ("off", "off"), "other client": ("on", "on")}


def test_the_web_fanout_does_not_listen_through_a_pooler(pooler, monkeypatch):
    """The web app has no start of its own to refuse: its fanout looks before its first LISTEN, and
    stays silent rather than register an event watcher nobody would hear."""
    monkeypatch.setattr(live, "_hubs", {})
    no_event_watchers_left()

    async def scenario() -> tuple[str | None, float]:
        fanout = live.process_fanout()
        fanout.subscribe(TASK_EVENT)
        began = asyncio.get_running_loop().time()
        await fanout.ready()
        waited = asyncio.get_running_loop().time() - began
        await fanout.close()
        return fanout.refused, waited

    with override_settings(VALKA=_direct(pooler.url)):
        refused, waited = asyncio.run(scenario())
    assert refused == ("web: VALKA_DIRECT_DATABASE_URL leads through a transaction pooler: point it at PostgreSQL "
                       "itself (LISTEN, the leader lock and the claims need sessions of their own)")
    assert waited < 10  # the streams waiting for it were let go at once
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM task_event_watchers")
        assert cur.fetchone()[0] == 0


def test_the_web_app_remembers_no_key_through_a_pooler(pooler, caplog):
    """Through a pooler its LISTEN would hear no revocation: the web app reads every key instead."""
    keys = LiveKeys()
    with caplog.at_level(logging.WARNING, logger="valka.live_keys"):
        keys.start(lambda: pooler.url)
        keys.listen()
        wait_for(lambda: "leads through a transaction pooler" in caplog.text, 10, what="the warning")
        keys.stop()
    assert not keys.listening
    record, _ = api_key_create(name="svc")
    reads = []
    for _ in range(2):
        assert keys.get(record.key_hash, lambda key_hash: reads.append(key_hash) or record) is record
    assert len(reads) == 2


# -- The processes. --

def _env(**env: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "VALKA_DB_POOL": "false", "VALKA_DEVELOPMENT": "true",
            "VALKA_DB_PREPARED_STATEMENTS": "false", "VALKA_DIRECT_DATABASE_URL": "", **env}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run_dispatcher", "run_scheduler"])
def test_a_process_refuses_to_start_through_a_pooler_with_one_line(pooler, command):
    through = subprocess.run([sys.executable, "manage.py", command], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, env=_env(DATABASE_URL=pooler.url))
    assert through.returncode != 0
    assert through.stderr.strip().splitlines() == [
        f"CommandError: {command}: DATABASE_URL leads through a transaction pooler: set VALKA_DIRECT_DATABASE_URL "
        "to a URL that reaches PostgreSQL itself (LISTEN, the leader lock and the claims need sessions of their own)"]
    direct_through = subprocess.run([sys.executable, "manage.py", command], cwd=ROOT, capture_output=True,
                                    text=True, timeout=60,
                                    env=_env(DATABASE_URL=database_url(), VALKA_DIRECT_DATABASE_URL=pooler.url))
    assert direct_through.returncode != 0
    assert "VALKA_DIRECT_DATABASE_URL leads through a transaction pooler" in direct_through.stderr.strip()


@pytest.mark.slow
def test_the_stack_runs_through_a_pooler_with_a_direct_url_beside_it(pooler, tmp_path, request):
    stack = Stack(tmp_path, url=pooler.url)
    stack.env.update(_env(DATABASE_URL=pooler.url, VALKA_DIRECT_DATABASE_URL=database_url()))
    try:
        _, addr = stack.dispatcher()
        scheduler = stack.scheduler(VALKA_SCHEDULER_MAX_SLEEP="0.2")
        web = stack.web()
        stack.worker(addr, queues="pooled")
        _, key = api_key_create(name="pooled")
        with Client(web, api_key=key) as client:  # the web app's writes go through the pooler
            created = client.create_task("echo", queue="pooled", input={"through": "pooler"})
        task = wait_status(created["id"], "COMPLETED")
        assert task.output["echo"] == {"through": "pooler"}
        wait_for(lambda: "leader now" in scheduler.log_path.read_text(), 30, what="the scheduler leading")  # type: ignore[attr-defined]

        def sessions() -> list[str]:
            with connection.cursor() as cur:
                cur.execute("SELECT application_name FROM pg_stat_activity WHERE datname = current_database()")
                return [row[0] for row in cur.fetchall()]

        # The key's look-up opened the web app's LISTEN for key changes (tasks.api.live_keys).
        wait_for(lambda: "valka-web api keys" in sessions(), 10, what="the web app's LISTEN for keys")
        names = sessions()
        # The sessions that need one are PostgreSQL's own; the rest came through the pooler.
        for kind in ("valka-dispatcher-listen ", "valka-dispatcher-claim ", "valka-scheduler ", "valka-web api keys"):
            assert any(name.startswith(kind) and (kind != "valka-scheduler " or name.endswith(" leader"))
                       for name in names), names
        assert "valka-test-pooler" in names and pooler.opened >= 1
        assert Task.objects.filter(queue="pooled", status="COMPLETED").count() == 1
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop_all()
