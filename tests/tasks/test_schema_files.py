"""The database's functions, triggers and views are those of the files under tasks/sql/schema/
(and of the files other apps registered in `schema.OTHERS`, the same way).

The test database is built by the migrations, so it holds what they left: these tests fail when
a migration defined code the files do not hold (or left code the files no longer define), and
when the files changed after the latest migration that applies them was written.
"""

import importlib
from pathlib import Path

import pytest
from django.db import connection

from tasks.sql import schema

pytestmark = pytest.mark.django_db  # each test runs in a transaction that is rolled back

# Every function named valka_*, every trigger on a table of the schema and every view of it: its
# kind, its name as DROP takes it (a function's with its argument types) and its definition as
# PostgreSQL prints it.
CODE = """
SELECT 'FUNCTION', p.oid::regprocedure::text, pg_get_functiondef(p.oid)
FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace AND starts_with(p.proname, 'valka_')
UNION ALL
SELECT 'TRIGGER', quote_ident(t.tgname) || ' ON ' || t.tgrelid::regclass::text, pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = current_schema()::regnamespace AND NOT t.tgisinternal
UNION ALL
SELECT 'VIEW', c.oid::regclass::text, pg_get_viewdef(c.oid)
FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'v'
"""


def _code() -> dict[str, str]:
    """{"FUNCTION valka_uuid7()": its definition, ...}"""
    with connection.cursor() as cursor:
        cursor.execute(CODE)
        return {f"{kind} {name}": definition for kind, name, definition in cursor.fetchall()}


def _drop(code: dict[str, str]) -> None:
    """Drop the views, triggers and functions of `code` (back when the test's transaction rolls back)."""
    with connection.cursor() as cursor:
        for order in ("VIEW", "TRIGGER", "FUNCTION"):
            for kind, name in (key.split(" ", 1) for key in code):
                if kind == order:
                    cursor.execute(f"DROP {kind} IF EXISTS {name} CASCADE")


ALL = [schema.TASKS, *schema.OTHERS]


def test_the_files_define_the_migrated_code_exactly():
    migrated = _code()
    assert {"FUNCTION valka_uuid7()", "TRIGGER tasks_updated ON tasks"} <= set(migrated)
    _drop(migrated)
    assert _code() == {}
    for files in ALL:
        files.execute(connection)
    from_files = _code()
    left_over, missing = sorted(migrated.keys() - from_files.keys()), sorted(from_files.keys() - migrated.keys())
    assert not left_over, f"the migrations left code that tasks/sql/schema/ does not define: {left_over}"
    assert not missing, f"tasks/sql/schema/ defines code that the migrations did not leave: {missing}"
    for key, definition in migrated.items():
        assert from_files[key] == definition, f"{key}: the migrated database and tasks/sql/schema/ disagree"


def test_the_files_apply_again_over_themselves():
    migrated = _code()
    for files in ALL * 2:
        files.execute(connection)
    assert _code() == migrated


@pytest.mark.parametrize("files", ALL, ids=lambda files: files.app_label)
def test_every_file_is_applied(files):
    assert sorted(path.name for path in files.directory.glob("*.sql")) == sorted(files.files)


@pytest.mark.parametrize("files", ALL, ids=lambda files: files.app_label)
def test_the_latest_migration_that_applies_the_files_was_written_for_them_as_they_are(files):
    # A fresh database gets the files as they are now from every migration that applies them, so
    # a file changed without a migration that applies it again passes the tests above, while a
    # database migrated before the change never gets it. Each such migration records the files'
    # SHA-256 as it was written (SCHEMA_SHA256), and the latest one must match the files.
    package = f"{files.app_label}.migrations"
    folder = Path(importlib.import_module(package).__file__).parent
    recorded = [getattr(importlib.import_module(f"{package}.{path.stem}"), "SCHEMA_SHA256", None)
                for path in sorted(folder.glob("[0-9]*.py"))]
    recorded = [digest for digest in recorded if digest]
    assert recorded, f"no migration applies {files.directory}"
    assert recorded[-1] == files.sha256(), (
        f"{files.directory} changed after the latest migration that applies it: add a migration that "
        f"applies the files again (see tasks/sql/schema/__init__.py) with SCHEMA_SHA256 = {files.sha256()!r}")
