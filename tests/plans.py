"""Executed plans of the statements that matter for speed, for tests that assert their shape."""

import contextlib
from collections.abc import Callable, Iterator

from django.db import connection


def executed_plan(statement: str, params: dict, *, generic: bool, session: str = "",
                  planned_before: Callable[[], None] | None = None) -> dict:
    """EXPLAIN ANALYZE of `statement` prepared (named placeholders become $n), in the custom or
    the generic plan, on a session set up with `session` first. Its writes stay.

    `planned_before`: the statement runs once first, which plans it (a generic plan is kept);
    then `planned_before` changes the data under that plan, as a long-lived connection sees a
    table grow after its first claim."""
    names = list(params)
    prepared = statement
    for i, name in enumerate(names, 1):
        prepared = prepared.replace(f"%({name})s", f"${i}")
    with connection.cursor() as cur:
        if session:
            cur.execute(session)
        cur.execute(f"SET plan_cache_mode = {'force_generic_plan' if generic else 'force_custom_plan'}")
        cur.execute(f"PREPARE plan_under_test AS {prepared}")
        try:
            placeholders = ", ".join(["%s"] * len(names))
            if planned_before is not None:
                cur.execute(f"EXECUTE plan_under_test({placeholders})", [params[n] for n in names])
                planned_before()
            cur.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE plan_under_test({placeholders})",
                        [params[n] for n in names])
            return cur.fetchone()[0][0]["Plan"]
        finally:
            cur.execute("DEALLOCATE plan_under_test")
            cur.execute("RESET ALL")


def outline(plan: dict, depth: int = 0) -> str:
    """The plan as indented lines: node, index, alias, rows and loops."""
    line = "  " * depth + " ".join(str(plan.get(k, "")) for k in
                                   ("Node Type", "Index Name", "Alias", "Actual Rows", "Actual Loops"))
    return "\n".join([line] + [outline(child, depth + 1) for child in plan.get("Plans", [])])


def nodes(plan: dict) -> Iterator[dict]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


@contextlib.contextmanager
def no_autovacuum(*tables: str) -> Iterator[None]:
    """Keep autovacuum off `tables`, so their statistics stay as stale as the test made them."""
    with connection.cursor() as cur:
        for table in tables:
            cur.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    try:
        yield
    finally:
        with connection.cursor() as cur:
            for table in tables:
                cur.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
