from django.db import migrations

from tasks.sql import schema

# tasks/sql/schema/events.sql: the task event triggers split a statement's events into NOTIFYs
# that stay under PostgreSQL's 8,000-byte limit however long the events' names and errors are.

# schema.sha256() when this migration was written (tests/tasks/test_schema_files.py).
SCHEMA_SHA256 = "5701caa18ec418b5fd3d34034cf39d192903212eb2f41c33ff3597fab690a96b"


class Migration(migrations.Migration):
    dependencies = [("tasks", "0013_schema_code_from_files")]

    operations = [migrations.RunPython(schema.apply, reverse_code=migrations.RunPython.noop)]
