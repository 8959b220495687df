from django.db import migrations, models

# The delayed promoter's index: PENDING tasks created to run later (run_at after
# their creation), by due time. Tasks due at once are announced by whoever makes
# them PENDING, so they stay out of this index and it stays small.


class Migration(migrations.Migration):
    dependencies = [("tasks", "0003_retry_delay_and_worker_session")]

    operations = [
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("status", "PENDING"), ("run_at__gt", models.F("created_at"))),
                fields=["run_at"],
                name="tasks_delayed_idx",
            ),
        ),
    ]
