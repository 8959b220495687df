"""Drives the shop from a test, one JSON command a line on stdin, one JSON answer a line on stdout:

    {"op": "enqueue", "task": "add", "args": [1, 2], "using": {...}, "atomic": "commit"|"rollback"}
    {"op": "result", "task": "add", "id": "..."}

`python -m tests.django_project.driver` (DJANGO_SETTINGS_MODULE=tests.django_project.settings).
"""

import json
import sys
import traceback
from datetime import UTC, datetime, timedelta

import django


def enqueue(command):
    from django.db import transaction

    from tests.django_project.shop import models, tasks

    task = getattr(tasks, command["task"])
    using = dict(command.get("using", {}))
    if "run_after_seconds" in using:
        using["run_after"] = datetime.now(UTC) + timedelta(seconds=using.pop("run_after_seconds"))
    if using:
        task = task.using(**using)
    if "atomic" not in command:
        result = task.enqueue(*command.get("args", []), **command.get("kwargs", {}))
        return {"id": result.id, "status": result.status, "enqueued_at": str(result.enqueued_at)}

    class Rollback(Exception):
        pass

    try:
        with transaction.atomic():
            models.Order.objects.create(total=1)
            result = task.enqueue(*command.get("args", []), **command.get("kwargs", {}))
            answer = {"id": result.id, "status": result.status, "sent_in_transaction": result.enqueued_at is not None}
            if command["atomic"] == "rollback":
                raise Rollback
    except Rollback:
        pass
    answer["enqueued_at"] = str(result.enqueued_at)
    return answer


def result(command):
    from tests.django_project.shop import tasks

    task = getattr(tasks, command["task"])
    found = task.get_result(command["id"])
    answer = {"id": found.id, "status": found.status, "attempts": found.attempts, "worker_ids": found.worker_ids,
              "errors": [{"exception_class_path": e.exception_class_path, "traceback": e.traceback}
                         for e in found.errors],
              "args": found.args, "kwargs": found.kwargs, "queue_name": found.task.queue_name,
              "priority": found.task.priority, "is_finished": found.is_finished,
              "times": {name: str(getattr(found, name)) for name in
                        ("enqueued_at", "started_at", "finished_at", "last_attempted_at")}}
    if found.status == "SUCCESSFUL":
        answer["return_value"] = found.return_value
    return answer


def main():
    django.setup()
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            answer = {"ok": {"enqueue": enqueue, "result": result}[command["op"]](command)}
        except Exception as exc:
            answer = {"error": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": str(exc),
                      "traceback": traceback.format_exc()}
        print(json.dumps(answer, default=str), flush=True)


if __name__ == "__main__":
    main()
