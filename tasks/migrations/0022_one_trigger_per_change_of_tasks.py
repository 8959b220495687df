from django.db import migrations

from tasks.sql import schema

# tasks/sql/schema/task_triggers.sql: the tasks table's three INSERT triggers (counters, queue
# rows, events) become one, and so do its three UPDATE triggers; each trigger call has a cost of
# its own, and a single task's INSERT paid three.

# schema.sha256() when this migration was written (tests/tasks/test_schema_files.py).
SCHEMA_SHA256 = "132395f93797637594cba6e6b5e251a5c1ec875a762ac1bca8a13161375ab84b"

DROP_SEPARATE = """
DROP TRIGGER IF EXISTS tasks_count_inserts ON tasks;
DROP TRIGGER IF EXISTS tasks_count_transitions ON tasks;
DROP TRIGGER IF EXISTS tasks_events_insert ON tasks;
DROP TRIGGER IF EXISTS tasks_events_update ON tasks;
DROP TRIGGER IF EXISTS tasks_queue_rows ON tasks;
DROP TRIGGER IF EXISTS tasks_queue_slots_freed ON tasks;
DROP FUNCTION IF EXISTS valka_count_task_inserts();
DROP FUNCTION IF EXISTS valka_count_task_transitions();
DROP FUNCTION IF EXISTS valka_task_events_on_insert();
DROP FUNCTION IF EXISTS valka_task_events_on_update();
DROP FUNCTION IF EXISTS valka_queues_of_new_tasks();
DROP FUNCTION IF EXISTS valka_queue_slots_freed();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("tasks", "0021_api_key_changes_notified"),
    ]

    operations = [
        migrations.RunSQL(DROP_SEPARATE, reverse_sql=migrations.RunSQL.noop),
        migrations.RunPython(schema.apply, reverse_code=migrations.RunPython.noop),
    ]
