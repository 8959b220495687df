from django.db import migrations

from tasks.sql import schema

# tasks/sql/schema/api_keys.sql: a key revoked, changed or deleted is announced on
# valka_api_key_changed, so that the processes that remember live keys (tasks/api/live_keys.py)
# forget it.

# schema.sha256() when this migration was written (tests/tasks/test_schema_files.py).
SCHEMA_SHA256 = "5936768952fde3d19982293531c661b9ee952f77338a362cc9bd56c445788cef"


class Migration(migrations.Migration):

    dependencies = [
        ("tasks", "0020_queue_offers"),
    ]

    operations = [migrations.RunPython(schema.apply, reverse_code=migrations.RunPython.noop)]
