"""Hot statements run as prepared statements on Django's own connection.

Django opens its psycopg connections with prepared statements off (`prepare_threshold`
None, for the sake of transaction-mode poolers), and its cursors bind parameters client
side, so PostgreSQL parses and plans every statement again. For the few statements on a
producer's hot path that is a large share of their cost: about 0.3 ms of a single task's
INSERT. The settings (`VALKA_DB_PREPARED_STATEMENTS`, on by default) give the connections
a threshold no statement reaches by repetition, so only those run through here are
prepared, once per connection; the ORM's queries stay as Django runs them. With the
setting off, this runs the statement unprepared.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections


def fetchone_prepared(sql: str, params: Mapping[str, Any] | Sequence[Any]) -> tuple[Any, ...] | None:
    """Run `sql` on Django's connection, prepared, and fetch one row.

    It runs in the caller's transaction like any other statement, with Django's error
    wrapping, and is recorded in `connection.queries` when queries are logged.
    """
    db = connections[DEFAULT_DB_ALIAS]  # one look-up: each `connection.x` goes through a proxy
    db.ensure_connection()
    db.validate_no_broken_transaction()
    start = time.monotonic()
    with db.wrap_database_errors, psycopg.Cursor(db.connection) as cursor:
        cursor.execute(sql, params, prepare=True)
        row = cursor.fetchone()
    if db.queries_logged:
        db.queries_log.append({"sql": sql, "time": f"{time.monotonic() - start:.3f}"})
    return row


def fetchone_apart(sql: str, params: Mapping[str, Any] | Sequence[Any]) -> tuple[Any, ...] | None:
    """Run `sql`, prepared, on a connection taken for it alone, and fetch one row: for a look-up made
    outside any request's cycle (valka.asgi's, before a request's thread takes its own connection).

    With Django's pool (VALKA_DB_POOL, on by default) the connection is taken from the pool and
    given back straight, skipping what Django does to hand one out and take it back (signals,
    autocommit, the checks for a broken one): about a third of the look-up's CPU. It runs in
    autocommit, so nothing is left open. Without the pool, Django's connection is opened for it
    and closed afterwards, as a request's cycle would.
    """
    pool = connections[DEFAULT_DB_ALIAS].pool
    if pool is None:
        close_old_connections()
        try:
            return fetchone_prepared(sql, params)
        finally:
            close_old_connections()
    pool.open()  # opened by Django's first connection otherwise; a no-op once open
    with pool.connection() as conn:
        if not conn.autocommit:  # a connection Django has not handed out yet
            conn.autocommit = True
        with psycopg.Cursor(conn) as cursor:
            cursor.execute(sql, params, prepare=True)
            return cursor.fetchone()
