"""The database's code: the current definition of every function, trigger and view of Valka.

The `.sql` files here are the one source of truth for that code; tables, indexes and
constraints stay in the migrations. Every statement in them is re-runnable (`CREATE OR
REPLACE`), so applying the files again over a database that holds them changes nothing.

To change a function, trigger or view: edit its file, then add a migration that applies
the files again and records their fingerprint (tests/tasks/test_schema_files.py prints it):

    from tasks.sql import schema

    SCHEMA_SHA256 = "..."  # schema.sha256() when this migration was written

    operations = [migrations.RunPython(schema.apply, reverse_code=migrations.RunPython.noop)]

A migration reads the files when it runs, not as they were when it was written: migrating
a new database from scratch, 0013 already applies today's files. Function bodies are not
checked when applied (`check_function_bodies = off`), so a body may use a table or column
that a later migration adds. A trigger or view is checked: its tables and columns must
exist when 0013 runs (one on a later table needs a file that 0013 does not apply).
Renaming a function or changing its arguments creates a new one beside the old: drop the
old one in the migration.

So the migrations cannot go back past the newest one that creates a table the files use:
unapplying it would leave today's code on a database without that table. That migration's
schema.apply refuses to be unapplied (0023's `refuse_to_unapply`), with an error that says
so, before anything is written; a migration that adds such a table takes the refusal over.

tests/tasks/test_schema_files.py fails when the migrated database and the files
disagree, and when the files changed after the latest migration that applies them (its
SCHEMA_SHA256). Migrations 0002-0011 keep the SQL they ran, as history.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from django.db import transaction

DIRECTORY = Path(__file__).resolve().parent

# In the order they are applied: a trigger after its function, a function after those it calls.
FILES = ("ids.sql", "retry.sql", "counters.sql", "events.sql", "queues.sql", "task_triggers.sql", "api_keys.sql")


class SchemaFiles:
    """One app's database code: `files` in `directory`, applied in that order. The tasks app's
    are below; another app that keeps code of its own in the database (its tables' triggers)
    makes one of these, applies it from its migrations as tasks does, and adds it to `OTHERS`
    from its `AppConfig.ready()`, so that tests/tasks/test_schema_files.py checks it too."""

    def __init__(self, app_label: str, directory: Path, files: tuple[str, ...]) -> None:
        self.app_label = app_label
        self.directory = directory
        self.files = files

    def text(self, name: str | None = None) -> str:
        """The SQL of one file, or of all of them in order."""
        names = self.files if name is None else (name,)
        return "\n".join((self.directory / n).read_text(encoding="utf-8") for n in names)

    def sha256(self) -> str:
        """The files' fingerprint, which a migration that applies them records as SCHEMA_SHA256."""
        return hashlib.sha256(self.text().encode()).hexdigest()

    def execute(self, connection: Any) -> None:
        """Apply every file on a Django `connection`, in one transaction (or savepoint)."""
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('check_function_bodies')")
            checked = cursor.fetchone()[0]
            cursor.execute("SET LOCAL check_function_bodies = off")
            cursor.execute(self.text())
            cursor.execute("SELECT set_config('check_function_bodies', %s, true)", [checked])

    def apply(self, apps: Any, schema_editor: Any) -> None:
        """A `migrations.RunPython` operation's code: apply the files as they are now."""
        self.execute(schema_editor.connection)


TASKS = SchemaFiles("tasks", DIRECTORY, FILES)
# Other apps' database code, registered from their AppConfig.ready() (see SchemaFiles).
OTHERS: list[SchemaFiles] = []

text = TASKS.text
sha256 = TASKS.sha256
execute = TASKS.execute
apply = TASKS.apply
