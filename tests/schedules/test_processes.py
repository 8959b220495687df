"""Two real `manage.py run_scheduler` processes and a schedule due every second for 10 s: the leader is
SIGKILLed in the middle, the standby takes over, and every slot has exactly one task (catch_up all)."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest

from schedules import services
from tests.helpers import db_now, wait_for
from tests.schedules.helpers import tasks_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def log(proc) -> str:
    return proc.log_path.read_text()


def test_a_slot_a_second_survives_killing_the_leader(stack):
    one, two = stack.scheduler(), stack.scheduler()
    wait_for(lambda: any("loops running" in log(p) for p in (one, two)), 30, what="a scheduler to lead")
    leader, standby = (one, two) if "loops running" in log(one) else (two, one)
    wait_for(lambda: "standby" in log(standby), 30, what="the other to stand by")

    start = db_now().replace(microsecond=0) + timedelta(seconds=2)
    services.schedule_create(data={"name": "tick", "interval_seconds": 1, "catch_up": "all", "task_name": "tick",
                                   "queue": "ticks", "start_at": start, "end_at": start + timedelta(seconds=9)})
    slots = [start + timedelta(seconds=s) for s in range(10)]
    wait_for(lambda: len(tasks_of("tick")) >= 4, 20, what="the leader to fire a few slots")
    os.killpg(leader.pid, signal.SIGKILL)
    leader.wait(10)
    fired_by_leader = len(tasks_of("tick"))

    wait_for(lambda: len(tasks_of("tick")) >= 10, 30, what="the standby to fire the rest")
    time.sleep(1.5)  # anything extra would show by now
    made = tasks_of("tick")
    assert [task.run_at for task in made] == slots, "one task per slot, none missed"
    assert len({task.idempotency_key for task in made}) == 10
    assert fired_by_leader < 10 and "leader now" in log(standby) and "scheduled tasks created" in log(standby)
    # Those the leader fired were due within a second of their slot (the loop sleeps until each one).
    late = [(task.created_at - task.run_at).total_seconds() for task in made[:fired_by_leader]]
    assert all(0 <= seconds < 1.0 for seconds in late), late
