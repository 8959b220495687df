"""What other apps add to the scheduler: start-up hooks that wait out a database that is down,
and stop the scheduler on their own errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from django.db import OperationalError

from tasks.errors import ValidationError
from tasks.scheduler import extensions
from tests.helpers import ROOT, query, wait_for


@pytest.fixture
def hooks(monkeypatch):
    registered: list = []
    monkeypatch.setattr(extensions, "ON_START", registered)
    return registered


def test_a_hook_that_cannot_reach_the_database_is_tried_again(hooks):
    calls, slept = [], []

    def reconcile():
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("connection refused")

    hooks.append(reconcile)
    extensions.run_on_start(sleep=slept.append)
    assert len(calls) == 3 and slept == [0.5, 1.0]


def test_a_hooks_own_error_stops_at_once(hooks):
    def invalid():
        raise ValidationError("VALKA_SCHEDULES[0] (x): cron: is not valid", {"cron": ["is not valid"]})

    hooks.append(invalid)
    with pytest.raises(ValidationError):
        extensions.run_on_start(sleep=lambda _: pytest.fail("a hook's own error is not retried"))


@pytest.mark.timeout(120)
def test_a_scheduler_started_while_postgresql_is_down_waits_for_it(own_cluster, tmp_path):
    """Restarted during an outage, the scheduler neither exits nor skips its start-up work: it
    reconciles VALKA_SCHEDULES once PostgreSQL is back, then leads."""
    own_cluster.stop("fast")
    log = tmp_path / "scheduler.log"
    declared = [{"name": "nightly", "cron": "0 3 * * *", "task_name": "report", "queue": "reports"}]
    env = dict(os.environ, DATABASE_URL=own_cluster.url, PYTHONUNBUFFERED="1", VALKA_DB_POOL="false",
               VALKA_LOG_LEVEL="INFO", VALKA_DEVELOPMENT="true", VALKA_SCHEDULES=json.dumps(declared))
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "manage.py", "run_scheduler"], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "could not reach the database" in log.read_text(), 60, what="the first retry logged")
        time.sleep(1.5)
        assert proc.poll() is None, log.read_text()
        own_cluster.start()
        wait_for(lambda: "leader now" in log.read_text() or proc.poll() is not None, 60, what="leadership")
        assert proc.poll() is None, log.read_text()
        assert query(own_cluster, "SELECT name, declared FROM schedules") == [("nightly", True)]
    finally:
        proc.terminate()
        proc.wait(20)
