"""factory-boy factories. Tests may build rows in any status directly: only
production code is bound to the state machine's guarded updates."""

from datetime import timedelta

import factory
from django.utils import timezone

from signals.models import Signal
from tasks.models import DeadLetter, Task, TaskLog, TaskRun, Worker
from tasks.states import FINAL_STATES, TaskStatus


class TaskFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Task

    task_name = factory.Sequence(lambda n: f"job.{n}")
    queue = "default"
    status = TaskStatus.PENDING.value
    input = factory.LazyFunction(lambda: {"n": 1})
    metadata = factory.LazyFunction(dict)
    finished_at = factory.LazyAttribute(lambda o: timezone.now() if o.status in FINAL_STATES else None)


class TaskRunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = TaskRun

    task = factory.SubFactory(TaskFactory, status=TaskStatus.RUNNING.value, attempt_count=1)
    attempt_number = factory.LazyAttribute(lambda o: max(o.task.attempt_count, 1))
    worker_id = "worker-1"
    status = "RUNNING"
    lease_expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(seconds=300))
    finished_at = factory.LazyAttribute(lambda o: None if o.status == "RUNNING" else timezone.now())


class TaskLogFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = TaskLog

    run = factory.SubFactory(TaskRunFactory)
    task = factory.LazyAttribute(lambda o: o.run.task)
    timestamp = factory.LazyFunction(timezone.now)
    level = "INFO"
    message = factory.Sequence(lambda n: f"line {n}")


class DeadLetterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DeadLetter

    task = factory.SubFactory(TaskFactory, status=TaskStatus.DEAD_LETTER.value, attempt_count=4)
    task_name = factory.LazyAttribute(lambda o: o.task.task_name)
    queue = factory.LazyAttribute(lambda o: o.task.queue)
    input = factory.LazyAttribute(lambda o: o.task.input)
    metadata = factory.LazyAttribute(lambda o: o.task.metadata)
    error_message = "boom"
    attempt_count = 4


class WorkerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Worker

    id = factory.Sequence(lambda n: f"worker-{n}")
    name = factory.Sequence(lambda n: f"host-{n}")
    queues = factory.LazyFunction(lambda: ["default"])
    concurrency = 4
    node_id = "node-a"


class SignalFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Signal

    task = factory.SubFactory(TaskFactory, status=TaskStatus.RUNNING.value)
    signal_type = "progress_request"
    payload = factory.LazyFunction(dict)
