from django.db import migrations

from tasks.sql import schema

# tasks/sql/schema/counters.sql: the counters are folded by the scheduler's retention loop, no
# longer by /metrics and the overview, which now only read (the function itself is unchanged).

# schema.sha256() when this migration was written (tests/tasks/test_schema_files.py).
SCHEMA_SHA256 = "7aa8a9e4c56634aa23f71f2b6fbe1afd1ea5b3ee1a3039c5c2f68babd27eeb85"


class Migration(migrations.Migration):
    dependencies = [("tasks", "0017_api_key_scopes")]

    operations = [migrations.RunPython(schema.apply, reverse_code=migrations.RunPython.noop)]
