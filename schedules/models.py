"""A schedule: when to create a task (a cron expression or an interval) and the task it creates.

The ORM serves CRUD, the API and the admin, through `schedules.services`; the scheduler's
firing loop reads and advances the rows with the statements of `schedules.sql`. The columns
after "what the scheduler keeps" are the firing loop's: no form or request writes them.
"""

from django.db import models
from django.db.models import Q

from tasks.models import Task
from tasks.specs import MAX_NAME, QUEUE_PATTERN

MAX_SCHEDULE_NAME = 200  # leaves room in an idempotency key (255) for "schedule:", ":manual:" and a UUID


class CatchUp(models.TextChoices):
    LATEST = "latest"  # after downtime, fire the most recent missed slot once
    NONE = "none"  # skip missed slots
    ALL = "all"  # fire every missed slot (at most the last MAX_CATCH_UP)


class Schedule(models.Model):
    name = models.CharField(max_length=MAX_SCHEDULE_NAME, unique=True)
    cron = models.CharField(max_length=MAX_NAME, null=True, blank=True)
    interval_seconds = models.IntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    catch_up = models.CharField(max_length=8, choices=CatchUp.choices, default=CatchUp.LATEST)
    enabled = models.BooleanField(default=True)
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    # Declared in VALKA_SCHEDULES: kept by run_scheduler's reconciliation, read-only elsewhere but `enabled`.
    declared = models.BooleanField(default=False)

    # The task it creates.
    task_name = models.CharField(max_length=MAX_NAME)
    queue = models.CharField(max_length=MAX_NAME)
    input = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    priority = models.IntegerField(default=0)
    max_retries = models.IntegerField(default=3)
    timeout_seconds = models.IntegerField(default=300)

    # What the scheduler keeps.
    next_run_at = models.DateTimeField(null=True, blank=True, help_text="The next slot; empty once past end_at.")
    last_run_at = models.DateTimeField(null=True, blank=True, help_text="The slot (or trigger) of the last task.")
    # No database constraint: retention deletes tasks by the million, and a foreign key would make
    # each delete look here. A deleted task leaves a dangling id, which the pages show as gone.
    last_task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
                                  db_index=False,
                                  related_name="+")
    fired_count = models.BigIntegerField(default=0, help_text="Slots fired (valka_schedule_fired_total).")
    last_lag_seconds = models.FloatField(
        null=True, blank=True, help_text="Fire time − slot of the last slot fired (valka_schedule_lag_seconds).")

    created_at = models.DateTimeField(db_default=models.functions.Now())
    updated_at = models.DateTimeField(db_default=models.functions.Now())

    class Meta:
        db_table = "schedules"
        ordering = ["name"]
        permissions = [("trigger_schedule", "Can trigger schedules now")]
        constraints = [
            # The firing loop writes names into JSON and idempotency keys as they are: none may need quoting.
            models.CheckConstraint(condition=Q(name__regex=QUEUE_PATTERN), name="schedules_name_valid"),
            models.CheckConstraint(
                condition=(Q(cron__isnull=False) & Q(interval_seconds__isnull=True))
                | (Q(cron__isnull=True) & Q(interval_seconds__isnull=False)),
                name="schedules_cron_xor_interval",
            ),
            models.CheckConstraint(condition=Q(interval_seconds__gte=1), name="schedules_interval_positive"),
            models.CheckConstraint(condition=Q(catch_up__in=[c.value for c in CatchUp]),
                                   name="schedules_catch_up_valid"),
            models.CheckConstraint(
                condition=Q(end_at__isnull=True) | Q(start_at__isnull=True) | Q(end_at__gt=models.F("start_at")),
                name="schedules_end_after_start",
            ),
        ]
        indexes = [
            # The firing loop: due schedules by due time, and its sleep until the earliest.
            models.Index(fields=["next_run_at"], name="schedules_due_idx",
                         condition=Q(enabled=True) & Q(next_run_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def every(self) -> str:
        """The timing as the pages show it: the cron expression, or "every N s"."""
        return self.cron if self.cron is not None else f"every {self.interval_seconds} s"
