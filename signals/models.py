"""Messages to a running task; delivery travels over the worker's gRPC stream."""

from django.db import models
from django.db.models import Q

from tasks.specs import MAX_NAME
from valka.ids import uuid7


class SignalStatus(models.TextChoices):
    PENDING = "PENDING"  # stored, waiting for the task's worker
    DELIVERED = "DELIVERED"  # sent down the worker's stream
    ACKNOWLEDGED = "ACKNOWLEDGED"  # the handler consumed it


class Signal(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    task = models.ForeignKey("tasks.Task", on_delete=models.DB_CASCADE, related_name="signals", db_index=False)
    signal_type = models.CharField(max_length=MAX_NAME)
    payload = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=SignalStatus.choices, default=SignalStatus.PENDING)
    created_at = models.DateTimeField(db_default=models.functions.Now())
    delivered_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "signals"
        ordering = ["id"]
        indexes = [
            models.Index(fields=["task", "id"], name="signals_task_idx"),
            models.Index(fields=["task", "id"], name="signals_pending_idx", condition=Q(status="PENDING")),
        ]

    def __str__(self) -> str:
        return f"{self.signal_type} → {self.task_id} [{self.status}]"
