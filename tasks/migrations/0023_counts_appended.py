from django.db import migrations
from django.db.migrations.exceptions import IrreversibleError

from tasks.sql import schema

# tasks/sql/schema/counters.sql: the tasks table's triggers append their counts to
# task_counter_deltas instead of UPSERTing a row of task_counters, and the fold moves them there;
# an UPSERT per statement was about 30 µs of a single task's enqueue.

# schema.sha256() when this migration was written (tests/tasks/test_schema_files.py).
SCHEMA_SHA256 = "3a224c26631f7ddb57491484e4acba26ffbffa417dca822b586de6af0f2e3180"

# No index: only the fold reads it whole, and the readers of the counters (a few seconds' worth).
DELTAS = """
CREATE TABLE task_counter_deltas (
    minute timestamptz NOT NULL,
    queue text NOT NULL,
    kind text NOT NULL,
    n bigint NOT NULL
);
"""


def refuse_to_unapply(apps, schema_editor):
    """Unapplying would drop a table that the database code still writes: that code is the files'
    of today (tasks/sql/schema), not the one 0022 applied, so every insert into tasks would fail
    from then on. Refused before anything is written; every migration before this one is behind it."""
    raise IrreversibleError(
        "tasks.0023_counts_appended cannot be unapplied: the tasks table's triggers, as "
        "tasks/sql/schema defines them today, write to task_counter_deltas, and without that table "
        "every insert into tasks would fail. It stays applied. To go back to an earlier Valka, "
        "restore a backup of the database taken before the upgrade.")


class Migration(migrations.Migration):
    dependencies = [("tasks", "0022_one_trigger_per_change_of_tasks")]

    operations = [
        migrations.RunSQL(DELTAS, reverse_sql=migrations.RunSQL.noop),
        migrations.RunPython(schema.apply, reverse_code=refuse_to_unapply),
    ]
