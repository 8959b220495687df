from django.db import migrations

from tasks.sql import schema

# From here on, the database's functions, triggers and views are those of the files under
# tasks/sql/schema/, read when this migration runs. Applied over 0012's database they change
# nothing: the files hold the definitions that 0002-0011 left. A later change to that code
# edits a file and adds a migration like this one (see tasks/sql/schema/__init__.py).

# schema.sha256() when this migration was written: tests/tasks/test_schema_files.py fails
# when the files change and no later migration applies them again.
SCHEMA_SHA256 = "c5ff33c1692aed44bd0119b3b057b986bd6529b6675d9fd26ce39f174c761985"


class Migration(migrations.Migration):
    dependencies = [("tasks", "0012_keyed_writes_by_primary_key")]

    operations = [migrations.RunPython(schema.apply, reverse_code=migrations.RunPython.noop)]
