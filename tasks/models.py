"""The queue's tables. The ORM serves CRUD, the API and the admin; status
changes never go through `save()` but through `tasks.states.guarded_update`.
"""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from tasks.specs import MAX_CONCURRENCY_KEY, MAX_NAME, RATE_PERIOD_RANGE
from tasks.states import FINAL_STATES, TaskStatus
from valka.ids import uuid7

STATUS_CHOICES = [(s.value, s.value) for s in TaskStatus]
_final = sorted(s.value for s in FINAL_STATES)


class RunStatus(models.TextChoices):
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    LOST = "LOST"  # lease expired or worker gone
    CANCELLED = "CANCELLED"


class Task(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    task_name = models.CharField(max_length=MAX_NAME)
    queue = models.CharField(max_length=MAX_NAME)
    status = models.CharField(max_length=16, choices=STATUS_CHOICES, default=TaskStatus.PENDING.value)
    priority = models.IntegerField(default=0)
    max_retries = models.IntegerField(default=3)
    attempt_count = models.IntegerField(default=0)
    timeout_seconds = models.IntegerField(default=300)
    idempotency_key = models.CharField(max_length=MAX_NAME, null=True, blank=True)
    input = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    output = models.JSONField(null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    run_at = models.DateTimeField(db_default=models.functions.Now())
    created_at = models.DateTimeField(db_default=models.functions.Now())
    updated_at = models.DateTimeField(db_default=models.functions.Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(
        max_length=MAX_NAME, null=True, blank=True,
        help_text="The dispatcher node that last claimed the task; guards its DISPATCHING → RUNNING/PENDING moves.",
    )
    # Indexed only where set (see Meta.indexes): a full index would take a new entry on every status change.
    replayed_from_task = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.DB_SET_NULL, related_name="replays", db_index=False,
        help_text="The task this one replays (admin replay of a finished task, or a dead letter's task).",
    )
    replayed_from_dead_letter = models.ForeignKey(
        "DeadLetter", null=True, blank=True, on_delete=models.DB_SET_NULL, related_name="+", db_index=False,
        help_text="The dead letter this task was replayed from.",
    )
    # Indexed only where set (see Meta.indexes): tasks without a key cost the indexes nothing.
    concurrency_key = models.CharField(
        max_length=MAX_CONCURRENCY_KEY, null=True, blank=True,
        help_text="Tasks of one key share their queue's max_running_per_key, and keys take turns (docs/queues.md).",
    )

    class Meta:
        db_table = "tasks"
        ordering = ["-id"]
        # Checked by the admin's actions, on top of view permission (see tasks/admin.py).
        permissions = [("cancel_task", "Can cancel tasks"), ("replay_task", "Can replay finished tasks")]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=[s.value for s in TaskStatus]), name="tasks_status_valid"),
            models.CheckConstraint(condition=Q(max_retries__gte=0), name="tasks_max_retries_nonneg"),
            models.CheckConstraint(condition=Q(attempt_count__gte=0), name="tasks_attempt_count_nonneg"),
            models.CheckConstraint(
                condition=Q(timeout_seconds__gte=1) & Q(timeout_seconds__lte=86400), name="tasks_timeout_range"
            ),
            models.CheckConstraint(
                condition=~Q(status__in=_final) | Q(finished_at__isnull=False), name="tasks_final_has_finished_at"
            ),
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="tasks_idempotency_key_uniq",
            ),
        ]
        indexes = [
            # The delayed promoter: PENDING tasks created to run later, by due time.
            models.Index(
                fields=["run_at"], name="tasks_delayed_idx",
                condition=Q(status="PENDING") & Q(run_at__gt=models.F("created_at")),
            ),
            # The retry engine: RETRY tasks by their next attempt time.
            models.Index(fields=["run_at"], name="tasks_retry_due_idx", condition=Q(status="RETRY")),
            # No index is kept on DISPATCHING alone: the dispatcher's starts, keyed by id, were
            # planned as a scan of it (its statistics say "almost empty" while it holds an entry
            # for every task claimed since the last vacuum). The reaper reads DISPATCHING tasks
            # queue by queue from tasks_queue_status_idx instead.
            # Retention: finished tasks by age.
            models.Index(fields=["finished_at"], name="tasks_finished_idx", condition=Q(status__in=_final)),
            # The claim (PENDING by queue, then priority by priority, due time, age), the dashboard's
            # counts by queue × status and queue lag, and the API's filters.
            models.Index(
                "queue", "status", models.F("priority").desc(), "run_at", "id", name="tasks_queue_status_idx",
            ),
            models.Index(fields=["task_name"], name="tasks_task_name_idx"),
            models.Index(fields=["created_at"], name="tasks_created_idx"),
            # Replays by origin (and the foreign keys' ON DELETE SET NULL), for the few tasks that have one.
            models.Index(fields=["replayed_from_task"], name="tasks_replayed_task_idx",
                         condition=Q(replayed_from_task__isnull=False)),
            models.Index(fields=["replayed_from_dead_letter"], name="tasks_replayed_letter_idx",
                         condition=Q(replayed_from_dead_letter__isnull=False)),
            # The fair claim of a queue with max_running_per_key (dispatcher/sql.py CLAIM_LIMITED): its
            # keys with PENDING tasks, one probe each, and each key's due tasks in claim order; and
            # what each key has running. Keyed tasks only: the others never enter them.
            models.Index("queue", "concurrency_key", models.F("priority").desc(), "run_at", "id",
                         name="tasks_key_pending_idx",
                         condition=Q(status="PENDING") & Q(concurrency_key__isnull=False)),
            models.Index(fields=["queue", "concurrency_key"], name="tasks_key_active_idx",
                         condition=Q(status__in=["DISPATCHING", "RUNNING"]) & Q(concurrency_key__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} [{self.status}] {self.id}"


class TaskRun(models.Model):
    """One attempt of a task: the lease lives here."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    task = models.ForeignKey(Task, on_delete=models.DB_CASCADE, related_name="runs", db_index=False)
    attempt_number = models.IntegerField()
    worker_id = models.CharField(max_length=MAX_NAME)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING)
    output = models.JSONField(null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    lease_expires_at = models.DateTimeField()
    started_at = models.DateTimeField(db_default=models.functions.Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "task_runs"
        ordering = ["task", "attempt_number"]
        constraints = [
            models.UniqueConstraint(fields=["task", "attempt_number"], name="task_runs_task_attempt_uniq"),
            # A run is RUNNING exactly while it has no finished_at. The partial indexes below say
            # "finished_at IS NULL" rather than "status = 'RUNNING'": the dispatcher's keyed updates
            # of RUNNING runs (results, heartbeats) then cannot be planned as a scan of one of them
            # (whose statistics say "almost empty" while it holds an entry for every run since the
            # last vacuum); the statements that want them say "finished_at IS NULL".
            models.CheckConstraint(
                condition=Q(status="RUNNING") | Q(finished_at__isnull=False), name="task_runs_closed_has_finished_at"
            ),
            models.CheckConstraint(
                condition=~Q(status="RUNNING") | Q(finished_at__isnull=True), name="task_runs_running_unfinished"
            ),
            # At most one live run per task: two workers can never hold one task.
            models.UniqueConstraint(fields=["task"], condition=Q(finished_at__isnull=True),
                                    name="task_runs_one_running"),
        ]
        indexes = [
            models.Index(fields=["lease_expires_at"], name="task_runs_lease_idx",
                         condition=Q(finished_at__isnull=True)),
            models.Index(fields=["worker_id"], name="task_runs_worker_idx", condition=Q(finished_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"run {self.attempt_number} of {self.task_id} [{self.status}]"


class TaskLog(models.Model):
    class Level(models.TextChoices):
        DEBUG = "DEBUG"
        INFO = "INFO"
        WARN = "WARN"
        ERROR = "ERROR"

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(TaskRun, on_delete=models.DB_CASCADE, related_name="logs", db_index=False)
    task = models.ForeignKey(Task, on_delete=models.DB_CASCADE, related_name="logs", db_index=False)
    timestamp = models.DateTimeField()
    level = models.CharField(max_length=8, choices=Level.choices, default=Level.INFO)
    message = models.TextField()
    metadata = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "task_logs"
        ordering = ["id"]
        indexes = [
            models.Index(fields=["run", "id"], name="task_logs_run_idx"),
            models.Index(fields=["task"], name="task_logs_task_idx"),
        ]


class DeadLetter(models.Model):
    """A task that exhausted its retries, kept with what is needed to replay it."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    task = models.OneToOneField(
        Task, null=True, blank=True, on_delete=models.DB_SET_NULL, related_name="dead_letter"
    )
    task_name = models.CharField(max_length=MAX_NAME)
    queue = models.CharField(max_length=MAX_NAME)
    input = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    error_message = models.TextField(null=True, blank=True)
    attempt_count = models.IntegerField()
    # The task's own settings, which a replay gives the new task (NULL in letters older than them:
    # a replay then takes the defaults).
    priority = models.IntegerField(null=True, blank=True)
    max_retries = models.IntegerField(null=True, blank=True)
    timeout_seconds = models.IntegerField(null=True, blank=True)
    concurrency_key = models.CharField(max_length=MAX_CONCURRENCY_KEY, null=True, blank=True)
    created_at = models.DateTimeField(db_default=models.functions.Now())
    replayed_at = models.DateTimeField(null=True, blank=True)
    replay_task = models.ForeignKey(
        Task, null=True, blank=True, on_delete=models.DB_SET_NULL, related_name="+",
        help_text="The task the latest replay created.",
    )
    replay_count = models.IntegerField(default=0)

    class Meta:
        db_table = "dead_letter_queue"
        ordering = ["-created_at"]
        permissions = [("replay_deadletter", "Can replay dead letters")]
        indexes = [
            models.Index(fields=["queue", "-created_at"], name="dlq_queue_idx"),
            models.Index(fields=["created_at"], name="dlq_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} ({self.queue}) {self.id}"


class Worker(models.Model):
    class Status(models.TextChoices):
        CONNECTED = "CONNECTED"
        DISCONNECTED = "DISCONNECTED"

    id = models.CharField(primary_key=True, max_length=MAX_NAME)
    name = models.CharField(max_length=MAX_NAME, blank=True, default="")
    queues = ArrayField(models.CharField(max_length=MAX_NAME), default=list)
    concurrency = models.IntegerField(default=1)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CONNECTED)
    node_id = models.CharField(max_length=MAX_NAME, blank=True, default="", help_text="The dispatcher serving it.")
    session_id = models.CharField(max_length=64, blank=True, default="",
                                  help_text="The current stream; a reconnect replaces it.")
    metadata = models.JSONField(default=dict, blank=True)
    connected_at = models.DateTimeField(db_default=models.functions.Now())
    last_heartbeat_at = models.DateTimeField(db_default=models.functions.Now())
    disconnected_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "workers"
        ordering = ["-connected_at"]
        indexes = [
            models.Index(fields=["last_heartbeat_at"], name="workers_alive_idx", condition=Q(status="CONNECTED")),
            # Retention: workers disconnected long ago.
            models.Index(fields=["disconnected_at"], name="workers_gone_idx", condition=Q(status="DISCONNECTED")),
        ]

    def __str__(self) -> str:
        return f"{self.name or self.id} [{self.status}]"


class Queue(models.Model):
    """A queue's controls: pause, cluster-wide limits and fair shares by key (docs/queues.md).

    A row is made for each queue when its first task or worker appears (tasks/sql/schema/queues.sql,
    dispatcher/sql.py UPSERT_WORKER); a queue without one, or whose row sets nothing, has no
    limits. The settings change through `tasks.services` only; the claim keeps the bookkeeping
    below, under the row's lock.
    """

    name = models.CharField(primary_key=True, max_length=MAX_NAME)
    paused = models.BooleanField(db_default=False)
    paused_until = models.DateTimeField(null=True, blank=True, help_text="A pause ends by itself at this time.")
    max_running = models.IntegerField(null=True, blank=True,
                                      help_text="Most of its tasks DISPATCHING or RUNNING at once, cluster-wide.")
    rate_limit = models.IntegerField(null=True, blank=True,
                                     help_text="Most of its tasks started per rate_period_seconds, cluster-wide.")
    rate_period_seconds = models.IntegerField(db_default=1)
    max_running_per_key = models.IntegerField(null=True, blank=True,
                                              help_text="Most tasks of one concurrency key running at once.")
    description = models.TextField(blank=True, db_default="")
    created_at = models.DateTimeField(db_default=models.functions.Now())
    updated_at = models.DateTimeField(db_default=models.functions.Now())
    # The claim's bookkeeping (dispatcher/sql.py CLAIM_LIMITED). The rate window: when starts were
    # seen (each stamp no earlier than the starts it counts) and how many, and the tasks claimed
    # and not yet seen started. And the fair claim's turn: the key it served last.
    rate_stamps = ArrayField(models.DateTimeField(), null=True, blank=True)
    rate_counts = ArrayField(models.IntegerField(), null=True, blank=True)
    rate_pending = models.IntegerField(db_default=0)
    key_cursor = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "queues"
        ordering = ["name"]
        # Checked by the admin and the API on top of view permission (limits are `change_queue`).
        permissions = [("pause_queue", "Can pause and resume queues")]
        constraints = [
            models.CheckConstraint(condition=Q(max_running__gte=1), name="queues_max_running_positive"),
            models.CheckConstraint(condition=Q(rate_limit__gte=1), name="queues_rate_limit_positive"),
            models.CheckConstraint(condition=Q(max_running_per_key__gte=1), name="queues_max_running_per_key_positive"),
            models.CheckConstraint(condition=Q(rate_period_seconds__range=RATE_PERIOD_RANGE),
                                   name="queues_rate_period_range"),
        ]

    def __str__(self) -> str:
        return self.name


class QueueOffer(models.Model):
    """Idle slots a dispatcher offers for a queue: a task inserted on its own while one is offered
    is handed to that dispatcher in its INSERT (DISPATCHING, claimed by it) and announced to it
    alone, with the task in the NOTIFY, so it is sent without a claim (dispatcher/offers.py,
    tasks/sql/producer.py INSERT_TASK). Only the dispatcher that made a row writes it; producers
    take a slot at a time, under the row's lock, skipping a row another producer holds."""

    queue = models.CharField(max_length=MAX_NAME)
    node_id = models.CharField(max_length=MAX_NAME)
    channel = models.CharField(max_length=63, help_text="The NOTIFY channel the dispatcher listens on.")
    slots = models.IntegerField()
    expires_at = models.DateTimeField(help_text="Refreshed while the dispatcher lives; a dead one's lapse.")
    pk = models.CompositePrimaryKey("queue", "node_id")

    class Meta:
        db_table = "queue_offers"
        constraints = [models.CheckConstraint(condition=Q(slots__gte=0), name="queue_offers_slots_not_negative")]

    def __str__(self) -> str:
        return f"{self.queue}: {self.slots} slot(s) of {self.node_id}"


class ApiKey(models.Model):
    """An API key; only its SHA-256 is kept (keys are 256-bit random tokens)."""

    class Scope(models.TextChoices):
        # Each scope allows what the ones above it do (tasks.api.auth.Need says what each action needs).
        READ = "read"  # every read: tasks, runs, logs, dead letters, workers, queues, signals, events
        WRITE = "write"  # and create, cancel, replay, send signals, pause and resume queues, change schedules
        ADMIN = "admin"  # and delete tasks and schedules, change queues' limits

    name = models.CharField(max_length=MAX_NAME)
    prefix = models.CharField(max_length=16, help_text="The first characters, to recognise a key.")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.WRITE)

    class Meta:
        db_table = "api_keys"
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def allows(self, scope: str) -> bool:
        order = list(self.Scope)
        return order.index(self.Scope(self.scope)) >= order.index(self.Scope(scope))
