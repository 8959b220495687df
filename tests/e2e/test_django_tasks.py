"""Django's task API on Valka, end to end: the test Django project (tests/django_project, not
Valka: its own settings, app and SQLite database) enqueues through `ValkaBackend` over REST, its
`manage.py valka_worker` runs the `@task` functions, and `get_result` reads them back."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest

from tasks import services
from tasks.models import Task, TaskLog, Worker
from tests.helpers import ROOT, wait_for, wait_status
from valka_sdk import Client

pytestmark = pytest.mark.timeout(90)


class Shop:
    """The test project's driver process (tests/django_project/driver.py): enqueue and read results."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.django_project.driver"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def send(self, **command):
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def enqueue(self, task: str, *args, kwargs=None, **command):
        answer = self.send(op="enqueue", task=task, args=list(args), kwargs=kwargs or {}, **command)
        assert "ok" in answer, answer
        return answer["ok"]

    def result(self, task: str, task_id: str):
        return self.send(op="result", task=task, id=task_id)

    def wait_finished(self, task: str, task_id: str, timeout: float = 30.0):
        wait_for(lambda: self.result(task, task_id)["ok"]["is_finished"], timeout, what=f"{task} {task_id} finished")
        return self.result(task, task_id)["ok"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(10)
        self.proc.stdout.close()


@pytest.fixture
def shop(stack, tmp_path):
    """The stack (web, dispatcher, scheduler) and the shop's environment; `shop.start(worker args)`."""
    web = stack.web()
    _, addr = stack.dispatcher(VALKA_RETRY_BASE_DELAY="0.2")
    stack.scheduler(VALKA_SCHEDULER_MAX_SLEEP="0.2")
    env = {**stack.env, "DJANGO_SETTINGS_MODULE": "tests.django_project.settings", "VALKA_URL": web,
           "VALKA_DISPATCHER": addr, "SHOP_DB": str(tmp_path / "shop.sqlite3"), "SHOP_MARKS": str(tmp_path / "marks")}
    driver = Shop(env)
    driver.env = env  # type: ignore[attr-defined]
    yield driver
    driver.close()


def marks(shop) -> list[tuple[str, float]]:
    path = shop.env["SHOP_MARKS"]
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        return []
    return [(name, float(at)) for name, at in (line.split() for line in lines)]


def signals_of(shop, task_id: str) -> list[tuple[str, str, list[str]]]:
    """The task signals the shop's receivers heard for `task_id`: (signal, status, errors' classes)."""
    with open(shop.env["SHOP_MARKS"] + ".signals") as f:
        lines = [json.loads(line) for line in f]
    assert {line["sender"] for line in lines} == {"ValkaBackend"}
    return [(line["signal"], line["status"], line["errors"]) for line in lines if line["id"] == task_id]


def test_enqueue_run_retry_fail_and_read_the_results(stack, shop):
    stack.django_worker("--concurrency", "4", **shop.env)
    added = shop.enqueue("add", 2, 3)
    assert added["status"] == "READY" and added["enqueued_at"] != "None", "sent at once outside a transaction"
    summed = shop.enqueue("async_add", 1, kwargs={"b": 2})
    flaky = shop.enqueue("flaky", kwargs={"succeed_on": 2})
    charged = shop.enqueue("charge", 42)
    not_json = shop.enqueue("not_json")
    unknown = services.task_enqueue(task_name="tests.django_project.shop.tasks.not_a_task", queue="default",
                                    input={"args": [], "kwargs": {}})
    missing = services.task_enqueue(task_name="tests.django_project.shop.tasks.nope", queue="default",
                                    input={"args": [], "kwargs": {}})

    done = shop.wait_finished("add", added["id"])
    assert (done["status"], done["return_value"], done["attempts"]) == ("SUCCESSFUL", 5, 1)
    assert (done["args"], done["queue_name"]) == ([2, 3], "shop")
    row = Task.objects.get(id=added["id"])
    assert (row.task_name, row.queue, row.input) == ("tests.django_project.shop.tasks.add", "shop",
                                                     {"args": [2, 3], "kwargs": {}})
    assert TaskLog.objects.filter(run__task_id=added["id"], message="adding 2 and 3", level="WARN").exists(), \
        "Python logging inside the task goes to the run's log"
    assert done["worker_ids"] == [row.runs.get().worker_id]
    times = {name: datetime.fromisoformat(value) for name, value in done["times"].items()}
    assert times["enqueued_at"] <= times["started_at"] == times["last_attempted_at"] <= times["finished_at"]

    assert shop.wait_finished("async_add", summed["id"])["return_value"] == {"sum": 3}

    retried = shop.wait_finished("flaky", flaky["id"])
    assert (retried["status"], retried["return_value"], retried["attempts"]) == \
        ("SUCCESSFUL", {"attempt": 2, "attempts": 2}, 2)
    assert [e["exception_class_path"] for e in retried["errors"]] == ["builtins.ConnectionError"]
    assert f"ConnectionError: attempt 1 of {flaky['id']}" in retried["errors"][0]["traceback"]

    failed = shop.wait_finished("charge", charged["id"])
    assert (failed["status"], failed["attempts"]) == ("FAILED", 1)
    (error,) = failed["errors"]
    assert error["exception_class_path"] == "tests.django_project.shop.tasks.CardDeclined"
    assert error["traceback"].startswith("Traceback (most recent call last):")
    assert 'shop/tasks.py", line' in error["traceback"] and "card declined for 42" in error["traceback"]
    assert Task.objects.get(id=charged["id"]).metadata == {"team": "billing"}

    refused = shop.wait_finished("not_json", not_json["id"])
    assert refused["status"] == "FAILED"
    assert "the task's return value is not JSON" in refused["errors"][0]["traceback"]
    gone = wait_status(unknown.id, "FAILED")
    assert "is not a @task function" in gone.error_message and gone.attempt_count == 1
    gone = wait_status(missing.id, "FAILED")
    assert "'tests.django_project.shop.tasks.nope' is not importable" in gone.error_message
    assert gone.attempt_count == 1

    # Django's task signals, around every run, sync or async, from the backend's class.
    ran = [("task_started", "RUNNING", []), ("task_finished", "SUCCESSFUL", [])]
    assert signals_of(shop, added["id"]) == signals_of(shop, summed["id"]) == ran
    assert signals_of(shop, flaky["id"]) == [("task_started", "RUNNING", []),
                                             ("task_finished", "FAILED", ["builtins.ConnectionError"]), *ran]
    card = "tests.django_project.shop.tasks.CardDeclined"
    assert signals_of(shop, charged["id"]) == [("task_started", "RUNNING", []), ("task_finished", "FAILED", [card])]

    assert shop.result("add", str(unknown.id))["error"] == "django.tasks.exceptions.TaskResultDoesNotExist"
    assert shop.result("add", "0190f6e0-0000-7000-8000-000000000000")["error"].endswith("TaskResultDoesNotExist")
    assert shop.result("async_add", added["id"])["error"].endswith("TaskResultMismatch")


def test_on_commit_rollback_run_after_and_priorities(stack, shop):
    kept = shop.enqueue("record", "committed", atomic="commit")
    assert kept["sent_in_transaction"] is False and kept["enqueued_at"] != "None", "sent once committed"
    dropped = shop.enqueue("record", "rolled-back", atomic="rollback")
    assert not Task.objects.filter(id=dropped["id"]).exists()
    assert shop.result("record", dropped["id"])["error"].endswith("TaskResultDoesNotExist")
    later = shop.enqueue("record", "later", using={"run_after_seconds": 3, "queue_name": "default"})
    # One task at a time: the ordered queue's tasks wait behind `hold`, then run by priority.
    stack.django_worker("--concurrency", "1", "--queue", "ordered", "--queue", "default", **shop.env)
    wait_status(kept["id"], "COMPLETED")
    held = shop.enqueue("hold", 1.5)
    wait_status(held["id"], "RUNNING")
    for name, priority in (("low", -10), ("high", 50), ("middle", 0)):
        shop.enqueue("record", name, using={"priority": priority})
    wait_for(lambda: len(marks(shop)) >= 5, 30, what="every record ran")
    order = [name for name, _ in marks(shop)]
    assert order[0] == "committed" and order[1:4] == ["high", "middle", "low"]
    ran_later = shop.wait_finished("record", later["id"])
    started = datetime.fromisoformat(ran_later["times"]["started_at"])
    assert started >= datetime.fromisoformat(ran_later["times"]["enqueued_at"]).replace(microsecond=0) \
        and (started - datetime.fromisoformat(ran_later["times"]["enqueued_at"])).total_seconds() >= 2.9
    assert "rolled-back" not in order


def test_cancelling_through_valka_stops_the_function(stack, shop):
    stack.django_worker("--concurrency", "4", **shop.env)
    running = [shop.enqueue(task, name, 30) for task, name in (("sleeper", "async"), ("sync_sleeper", "sync"))]
    for answer in running:
        wait_status(answer["id"], "RUNNING")
    wait_for(lambda: {"async-started", "sync-started"} <= {name for name, _ in marks(shop)}, 10, what="started")
    with Client(shop.env["VALKA_URL"]) as client:  # the REST API (anonymous on the test stack)
        for answer in running:
            client.cancel_task(answer["id"])
    wait_for(lambda: {"async-stopped", "sync-stopped"} <= {name for name, _ in marks(shop)}, 10,
             what="both functions stopped")
    for (task, _), answer in zip((("sleeper", "async"), ("sync_sleeper", "sync")), running, strict=True):
        result = shop.result(task, answer["id"])["ok"]
        assert result["status"] == "FAILED"
        assert result["errors"][0]["exception_class_path"] == "valka_sdk.errors.TaskCancelled"
    time.sleep(0.3)
    assert not {"async-finished", "sync-finished"} & {name for name, _ in marks(shop)}


def test_sigterm_lets_a_running_task_finish_then_exits(stack, shop):
    worker = stack.django_worker("--concurrency", "2", name="drainer", **shop.env)
    running = shop.enqueue("sync_sleeper", "draining", 2)
    wait_for(lambda: "draining-started" in {name for name, _ in marks(shop)}, 20, what="started")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0, "a clean exit once drained"
    assert "draining-finished" in {name for name, _ in marks(shop)}
    assert shop.result("sync_sleeper", running["id"])["ok"]["status"] == "SUCCESSFUL"
    wait_for(lambda: Worker.objects.filter(name="drainer", status="DISCONNECTED").exists(), what="disconnected")
