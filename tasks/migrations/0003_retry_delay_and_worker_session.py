from django.db import migrations, models

# The retry policy of tasks/retry.py (RetryPolicy.delay_for), for batch statements:
# base × 2^(attempt−1), capped, times a jitter factor in [1−jitter, 1+jitter), capped again.
RETRY_DELAY = """
CREATE OR REPLACE FUNCTION valka_retry_delay(attempt integer, base float8, cap float8, jitter float8,
                                             u float8 DEFAULT random())
RETURNS float8 AS $$
    SELECT LEAST(cap, GREATEST(0.0,
        LEAST(cap, base * power(2.0, LEAST(GREATEST(attempt, 1) - 1, 62))) * (1.0 + jitter * (2.0 * u - 1.0))))
$$ LANGUAGE sql VOLATILE PARALLEL SAFE;
"""


class Migration(migrations.Migration):
    dependencies = [("tasks", "0002_sql_functions")]

    operations = [
        migrations.RunSQL(RETRY_DELAY, reverse_sql="DROP FUNCTION IF EXISTS valka_retry_delay;"),
        migrations.AddField(
            model_name="task",
            name="claimed_by",
            field=models.CharField(
                blank=True, max_length=255, null=True,
                help_text="The dispatcher node that last claimed the task; guards its DISPATCHING → RUNNING/PENDING moves.",
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="session_id",
            field=models.CharField(blank=True, default="", max_length=64,
                                   help_text="The current stream; a reconnect replaces it."),
        ),
    ]
