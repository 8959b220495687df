"""The schedules app's database code: the trigger that wakes the firing loop.

The files here are applied by this app's migrations as `tasks.sql.schema` describes for the
tasks app's (a migration that applies them records `FILES.sha256()` as SCHEMA_SHA256), and
`SchedulesConfig.ready()` adds them to `tasks.sql.schema.OTHERS`, so the schema test holds
the migrated database to them.
"""

from pathlib import Path

from tasks.sql.schema import SchemaFiles

FILES = SchemaFiles("schedules", Path(__file__).resolve().parent, ("notify.sql",))
