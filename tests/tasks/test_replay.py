"""Replaying a dead letter: a new task as the original was, once per request even when requests race."""

import threading
import time

import pytest
from django.db import connection, transaction

from tasks import services
from tasks.models import DeadLetter, Task
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _dead_letter(**task) -> DeadLetter:
    """A task that exhausted its retries, dead-lettered by the statement the retry path uses."""
    original = TaskFactory(**{"status": "RETRY", "attempt_count": 3, "max_retries": 2, "error_message": "boom",
                              **task})
    services.dead_letter_tasks(task_ids=[original.id])
    return DeadLetter.objects.get(task_id=original.id)


def test_a_replay_keeps_the_priority_retries_and_timeout_of_the_original():
    letter = _dead_letter(priority=7, max_retries=2, timeout_seconds=42)
    task = services.dead_letter_replay(dead_letter_id=letter.id)
    assert (task.priority, task.max_retries, task.timeout_seconds) == (7, 2, 42)
    assert Task.objects.filter(id=task.id, priority=7, max_retries=2, timeout_seconds=42).exists()


def test_two_replays_of_one_dead_letter_at_once_make_one_task():
    letter = _dead_letter()
    first_done, second_started = threading.Event(), threading.Event()
    results: dict[str, Task] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                results["first"] = services.dead_letter_replay(dead_letter_id=letter.id)
                first_done.set()
                second_started.wait(10)
                time.sleep(0.5)  # the second request is under way: commit only now
        finally:
            connection.close()

    def second() -> None:
        try:
            first_done.wait(10)
            second_started.set()
            results["second"] = services.dead_letter_replay(dead_letter_id=letter.id)
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results["first"].id == results["second"].id
    assert Task.objects.filter(replayed_from_dead_letter_id=letter.id).count() == 1
    letter.refresh_from_db()
    assert (letter.replay_count, letter.replay_task_id) == (1, results["first"].id)
    # A replay asked for afterwards, knowing the first, is a replay again.
    again = services.dead_letter_replay(dead_letter_id=letter.id)
    assert again.id != results["first"].id
    assert DeadLetter.objects.get(id=letter.id).replay_count == 2
