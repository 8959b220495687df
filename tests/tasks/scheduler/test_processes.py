"""Two real `manage.py run_scheduler` processes on the test database: only the leader
acts; SIGKILL it and the standby takes over within seconds; no task is moved twice;
SIGTERM stops a scheduler cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.models import Task
from tests.factories import TaskFactory
from tests.helpers import ROOT, database_url, db_now, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MOVED = re.compile(r"retry engine: (\d+) tasks → PENDING")


class SchedulerProcess:
    def __init__(self, name: str, tmp: Path) -> None:
        self.log_path = tmp / f"{name}.log"
        env = dict(os.environ, DATABASE_URL=database_url(), PYTHONUNBUFFERED="1", VALKA_DB_POOL="false",
                   VALKA_LOG_LEVEL="INFO", VALKA_SCHEDULER_MAX_SLEEP="0.2", VALKA_REAPER_INTERVAL="1",
                   VALKA_DEVELOPMENT="true")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "run_scheduler"], cwd=ROOT, env=env,
                                         stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text()

    def moved(self) -> int:
        return sum(int(n) for n in MOVED.findall(self.log()))

    def wait_log(self, text: str, seconds: float) -> float:
        """Wait until `text` is in the log; returns when (monotonic)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if text in self.log():
                return time.monotonic()
            assert self.proc.poll() is None, f"scheduler exited early:\n{self.log()}"
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not logged within {seconds}s:\n{self.log()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def schedulers(transactional_db, tmp_path):
    started: list[SchedulerProcess] = []

    def start(name: str) -> SchedulerProcess:
        started.append(SchedulerProcess(name, tmp_path))
        return started[-1]

    yield start
    for p in started:
        p.kill()


def wait_all_pending(ids, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while Task.objects.filter(id__in=ids, status="PENDING").count() < len(ids):
        assert time.monotonic() < deadline, "retries not made PENDING in time"
        time.sleep(0.05)


def retries(n: int) -> list:
    now = db_now()
    return [TaskFactory(status="RETRY", attempt_count=1, run_at=now).id for _ in range(n)]


def test_only_the_leader_acts_and_a_standby_takes_over_after_sigkill(schedulers):
    a = schedulers("a")
    a.wait_log("scheduler: leader now", 20)
    b = schedulers("b")
    b.wait_log("scheduler: standby", 20)

    first = retries(10)
    wait_all_pending(first)
    wait_for(lambda: a.moved() >= 10, 10, what="a's moves logged")  # logged just after the commit
    time.sleep(0.5)  # give a wrongly acting standby the chance to show itself
    assert (a.moved(), b.moved()) == (10, 0)
    assert "loops running" not in b.log()

    a.proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    a.proc.wait(10)
    took_over = b.wait_log("scheduler: leader now", 15)
    assert took_over - killed < 8, "the standby takes over within a few seconds"

    second = retries(10)
    wait_all_pending(second)
    wait_for(lambda: b.moved() >= 10, 10, what="b's moves logged")
    time.sleep(0.5)
    assert (a.moved(), b.moved()) == (10, 10), "every task moved once, by exactly one scheduler"
    assert Task.objects.filter(id__in=first + second, status="PENDING", attempt_count=1).count() == 20

    b.proc.send_signal(signal.SIGTERM)
    assert b.proc.wait(15) == 0
    assert "scheduler: stopped" in b.log()
