"""The shop's receivers of Django's task signals: each signal a JSON line in SHOP_MARKS.signals."""

import json
import os

from django.dispatch import receiver
from django.tasks.signals import task_finished, task_started


def _record(signal, sender, task_result):
    line = {"signal": signal, "sender": sender.__name__, "id": task_result.id, "status": task_result.status,
            "errors": [error.exception_class_path for error in task_result.errors]}
    with open(os.environ["SHOP_MARKS"] + ".signals", "a") as f:
        f.write(json.dumps(line) + "\n")


@receiver(task_started)
def started(sender, task_result, **kwargs):
    _record("task_started", sender, task_result)


@receiver(task_finished)
def finished(sender, task_result, **kwargs):
    _record("task_finished", sender, task_result)
