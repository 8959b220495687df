"""Retention deletes exactly what is old and final, oldest first, in batches."""

from datetime import timedelta

import pytest

from signals.models import Signal
from tasks.models import DeadLetter, Task, TaskLog, TaskRun, Worker
from tasks.scheduler.retention import Retention
from tests.factories import DeadLetterFactory, SignalFactory, TaskFactory, TaskLogFactory, TaskRunFactory, WorkerFactory
from tests.helpers import connect, db_now, make_config, once, run_async

pytestmark = pytest.mark.django_db(transaction=True)


def finished(status, age_days, now, **extra):
    task = TaskFactory(status=status, finished_at=now - timedelta(days=age_days), **extra)
    run = TaskRunFactory(task=task, attempt_number=1, status="COMPLETED" if status == "COMPLETED" else "FAILED")
    TaskLogFactory(run=run)
    SignalFactory(task=task)
    return task


def test_old_final_tasks_go_with_their_runs_logs_and_signals():
    now = db_now()
    old = [finished(s, 8, now) for s in ("COMPLETED", "FAILED", "CANCELLED")]
    young = finished("COMPLETED", 6, now)
    # Old but not final: never touched, whatever their timestamps say.
    active = [TaskFactory(status=s, created_at=now - timedelta(days=60), updated_at=now - timedelta(days=60),
                          run_at=now - timedelta(days=60)) for s in ("PENDING", "RUNNING", "RETRY", "DISPATCHING")]
    dead = TaskFactory(status="DEAD_LETTER", finished_at=now - timedelta(days=8))
    DeadLetterFactory(task=dead)
    replay = TaskFactory(replayed_from_task=old[0])

    assert once(Retention(make_config(retention_days=7))) == 3

    assert set(Task.objects.values_list("id", flat=True)) == {young.id, dead.id, replay.id} | {t.id for t in active}
    gone = [t.id for t in old]
    assert not TaskRun.objects.filter(task_id__in=gone).exists()
    assert not TaskLog.objects.filter(task_id__in=gone).exists()
    assert not Signal.objects.filter(task_id__in=gone).exists()
    assert TaskRun.objects.filter(task_id=young.id).count() == 1
    assert TaskLog.objects.filter(task_id=young.id).count() == 1
    assert Signal.objects.filter(task_id=young.id).count() == 1
    assert Task.objects.get(id=replay.id).replayed_from_task_id is None
    assert once(Retention(make_config(retention_days=7))) == 0


def test_deletes_run_oldest_first_in_bounded_batches():
    now = db_now()
    tasks = [TaskFactory(status="COMPLETED", finished_at=now - timedelta(days=20 - i)) for i in range(5)]
    retention = Retention(make_config(retention_days=7, batch_size=2))

    async def one_batch() -> int:
        async with await connect() as conn, conn.transaction():
            return await retention.finished_batch(conn)

    assert run_async(one_batch) == 2
    assert set(Task.objects.values_list("id", flat=True)) == {t.id for t in tasks[2:]}
    assert once(retention) == 3
    assert not Task.objects.exists()


def test_dead_letters_have_their_own_longer_retention():
    now = db_now()
    old_letter = DeadLetterFactory(task=TaskFactory(status="DEAD_LETTER", finished_at=now - timedelta(days=31)))
    Task.objects.filter(id=old_letter.task_id).update(finished_at=now - timedelta(days=31))
    DeadLetter.objects.filter(id=old_letter.id).update(created_at=now - timedelta(days=31))
    young_letter = DeadLetterFactory()
    DeadLetter.objects.filter(id=young_letter.id).update(created_at=now - timedelta(days=29))
    orphan = TaskFactory(status="DEAD_LETTER", finished_at=now - timedelta(days=31))  # its letter was deleted
    young_orphan = TaskFactory(status="DEAD_LETTER", finished_at=now - timedelta(days=29))
    replay = TaskFactory(replayed_from_dead_letter=old_letter, replayed_from_task_id=old_letter.task_id)
    retention = Retention(make_config(retention_days=7, dead_letter_retention_days=30))

    assert once(retention) == 2  # the old letter (with its task) and the orphan

    assert list(DeadLetter.objects.values_list("id", flat=True)) == [young_letter.id]
    assert set(Task.objects.values_list("id", flat=True)) == {young_letter.task_id, young_orphan.id, replay.id}
    replay = Task.objects.get(id=replay.id)
    assert replay.replayed_from_dead_letter_id is None and replay.replayed_from_task_id is None
    assert orphan.id not in set(Task.objects.values_list("id", flat=True))


def test_workers_disconnected_long_ago_are_deleted():
    now = db_now()
    gone = WorkerFactory(status="DISCONNECTED", disconnected_at=now - timedelta(days=8))
    recent = WorkerFactory(status="DISCONNECTED", disconnected_at=now - timedelta(days=6))
    connected = WorkerFactory(status="CONNECTED", last_heartbeat_at=now, connected_at=now - timedelta(days=30))
    assert once(Retention(make_config(retention_days=7))) == 1
    assert set(Worker.objects.values_list("id", flat=True)) == {recent.id, connected.id}
    assert gone.id not in set(Worker.objects.values_list("id", flat=True))
