"""Queue controls against real dispatchers and SDK workers: max_running held through a drain across
two dispatchers, a rate limit counted from the runs, a pause mid-drain and one that ends by itself,
keys taking turns, and limits changed (set, raised, lowered, removed) while a drain runs; and the
capped drain's bound that `make bench` measures, a queue whose slots free once ends are written."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from datetime import datetime, timedelta

import psycopg
from django.db import connection

from tasks import services
from tasks.models import Queue, Task, TaskRun, Worker
from tests.helpers import database_url, db_now, wait_for


class Sampler:
    """Counts a queue's tasks DISPATCHING or RUNNING every `every` seconds, on a connection of its own."""

    def __init__(self, queue: str, every: float = 0.05) -> None:
        self.queue = queue
        self.every = every
        self.samples: list[tuple[float, int]] = []  # (time.monotonic(), count)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with psycopg.connect(database_url(), autocommit=True) as conn:
            while not self._stop.is_set():
                (n,) = conn.execute("SELECT count(*) FROM tasks WHERE queue = %s AND status IN "
                                    "('DISPATCHING', 'RUNNING')", [self.queue]).fetchone()
                self.samples.append((time.monotonic(), n))
                self._stop.wait(self.every)

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join(5)
        return self.samples

    def most(self, since: float = 0.0, until: float = float("inf")) -> int:
        return max((n for t, n in self.samples if since <= t < until), default=0)


def _runs(queue: str) -> list[tuple[datetime, datetime | None, str | None]]:
    """(started_at, finished_at, concurrency key) of the queue's runs, by start."""
    return list(TaskRun.objects.filter(task__queue=queue).order_by("started_at")
                .values_list("started_at", "finished_at", "task__concurrency_key"))


def _most_at_once(runs: list[tuple[datetime, datetime | None, str | None]]) -> int:
    """The most runs that were ever open at the same moment."""
    edges = sorted([(start, 1) for start, _, _ in runs] + [(end, -1) for _, end, _ in runs if end is not None],
                   key=lambda e: (e[0], e[1]))
    most = open_now = 0
    for _, step in edges:
        open_now += step
        most = max(most, open_now)
    return most


def _workers(stack, addrs: list[str], queue: str, count: int, concurrency: int = 8) -> None:
    for i in range(count):
        stack.worker(addrs[i % len(addrs)], queues=queue, concurrency=concurrency, name=f"{queue}-{i}")
    wait_for(lambda: Worker.objects.filter(status="CONNECTED", queues__contains=[queue]).count() == count,
             what=f"{count} workers on {queue}")
    assert Queue.objects.filter(name=queue).exists(), "a worker's hello makes its queue's row"


def _completed(queue: str, n: int, timeout: float) -> None:
    wait_for(lambda: Task.objects.filter(queue=queue, status="COMPLETED").count() == n, timeout,
             what=f"{n} tasks of {queue} completed")


def test_max_running_holds_across_two_dispatchers_through_a_whole_drain(stack):
    Queue.objects.create(name="capped", max_running=5)
    addrs = [stack.dispatcher()[1], stack.dispatcher()[1]]
    _workers(stack, addrs, "capped", 4)  # 32 slots
    sampler = Sampler("capped")
    services.task_enqueue_many([{"task_name": "sleep", "queue": "capped", "input": {"seconds": 0.02}}] * 500)
    _completed("capped", 500, timeout=120)
    sampler.stop()
    assert sampler.most() == 5, "sampled every 50 ms: never above the limit, and at it while draining"
    assert _most_at_once(_runs("capped")) <= 5
    assert TaskRun.objects.filter(task__queue="capped").count() == 500
    assert len({w for w in TaskRun.objects.values_list("worker_id", flat=True)}) > 1


def test_a_rate_limit_holds_in_every_one_second_window_of_the_runs(stack):
    Queue.objects.create(name="rated", rate_limit=20, rate_period_seconds=1)
    addrs = [stack.dispatcher()[1], stack.dispatcher()[1]]
    _workers(stack, addrs, "rated", 2)
    began = time.monotonic()
    services.task_enqueue_many([{"task_name": "echo", "queue": "rated"}] * 200)
    _completed("rated", 200, timeout=60)
    took = time.monotonic() - began
    starts = [start for start, _, _ in _runs("rated")]
    busiest = max(sum(1 for s in starts[i:] if s - start < timedelta(seconds=1)) for i, start in enumerate(starts))
    assert busiest <= 20, f"{busiest} starts in one second"
    assert busiest >= 15, "the limit, not the workers, set the pace"
    assert took >= 9, "200 tasks at 20 a second"
    assert took < 14, "a task kept back starts as soon as the window allows"


def test_a_pause_mid_drain_stops_new_starts_lets_running_tasks_finish_and_resume_drains_the_rest(stack):
    # No poll to fall back on: the pause and the resume reach the dispatcher by NOTIFY.
    _, addr = stack.dispatcher(VALKA_DISPATCH_POLL_INTERVAL="30")
    _workers(stack, [addr], "pausable", 2, concurrency=4)
    services.task_enqueue_many([{"task_name": "sleep", "queue": "pausable", "input": {"seconds": 0.3}}] * 60)
    wait_for(lambda: TaskRun.objects.filter(task__queue="pausable").count() >= 10, what="the drain under way")
    services.queue_pause(name="pausable")
    paused_at = db_now()
    late = services.task_enqueue(task_name="sleep", queue="pausable", input={"seconds": 0.3})
    assert late.status == "PENDING", "creating tasks still works"
    time.sleep(1.5)
    starts = [start for start, _, _ in _runs("pausable")]
    assert not [s for s in starts if s > paused_at + timedelta(seconds=1)], "a start more than 1 s after the pause"
    assert not Task.objects.filter(queue="pausable", status__in=["DISPATCHING", "RUNNING"]).exists(), \
        "the running tasks finished"
    left = Task.objects.filter(queue="pausable", status="PENDING").count()
    assert left >= 20
    services.queue_resume(name="pausable")
    resumed_at = db_now()
    wait_for(lambda: TaskRun.objects.filter(task__queue="pausable", started_at__gt=resumed_at).exists(), 5,
             what="a start after the resume")
    first = TaskRun.objects.filter(task__queue="pausable", started_at__gt=resumed_at).order_by("started_at")[0]
    assert first.started_at - resumed_at < timedelta(seconds=1), "the resume woke the claimer at once"
    _completed("pausable", 61, timeout=60)


def test_a_pause_with_an_end_resumes_by_itself(stack):
    # No poll to fall back on, and no NOTIFY when the pause ends: the dispatcher's own timer.
    _, addr = stack.dispatcher(VALKA_DISPATCH_POLL_INTERVAL="30")
    _workers(stack, [addr], "napping", 1)
    until = db_now() + timedelta(seconds=2)
    services.queue_pause(name="napping", until=until)
    services.task_enqueue_many([{"task_name": "echo", "queue": "napping"}] * 5)
    _completed("napping", 5, timeout=30)
    first = _runs("napping")[0][0]
    assert until <= first < until + timedelta(seconds=1), f"first start {first - until} after the pause's end"


def test_a_key_with_a_flood_does_not_hold_back_the_first_task_of_any_other_key(stack):
    Queue.objects.create(name="shared", max_running_per_key=2)
    _, addr = stack.dispatcher()
    _workers(stack, [addr], "shared", 2)
    # The flood first: in arrival order, every other key's tasks wait behind its thousand.
    services.task_enqueue_many([{"task_name": "echo", "queue": "shared", "concurrency_key": "big"}] * 1000)
    services.task_enqueue_many([{"task_name": "echo", "queue": "shared", "concurrency_key": f"small-{i}"}
                                for i in range(9) for _ in range(10)])
    wait_for(lambda: TaskRun.objects.filter(task__queue="shared", task__concurrency_key="big").count() >= 50, 60,
             what="the big key's 50th start")
    wait_for(lambda: TaskRun.objects.filter(task__queue="shared").exclude(task__concurrency_key="big")
             .values("task__concurrency_key").distinct().count() == 9, 30, what="a start of every small key")
    runs = _runs("shared")
    big_50th = [start for start, _, key in runs if key == "big"][49]
    firsts: dict[str, datetime] = {}
    for start, _, key in runs:
        firsts.setdefault(key, start)
    assert all(firsts[f"small-{i}"] < big_50th for i in range(9)), "a small key's first task came after the 50th"
    by_key: dict[str | None, list] = defaultdict(list)
    for run in runs:
        by_key[run[2]].append(run)
    assert max(_most_at_once(key_runs) for key_runs in by_key.values()) <= 2


def test_limits_changed_while_draining_take_effect_within_a_second(stack):
    Queue.objects.create(name="tuned", max_running=2)
    _, addr = stack.dispatcher(VALKA_DISPATCH_POLL_INTERVAL="30")
    _workers(stack, [addr], "tuned", 2)
    sampler = Sampler("tuned")
    services.task_enqueue_many([{"task_name": "sleep", "queue": "tuned", "input": {"seconds": 0.2}}] * 150)
    wait_for(lambda: TaskRun.objects.filter(task__queue="tuned").count() >= 4, what="the drain under way")
    raised = time.monotonic()
    services.queue_update(name="tuned", data={"max_running": 6})
    time.sleep(2.5)
    lowered = time.monotonic()
    services.queue_update(name="tuned", data={"max_running": 1})
    time.sleep(2.5)
    sampler.stop()
    assert sampler.most(until=raised) <= 2
    assert sampler.most(since=raised + 1, until=lowered) == 6, "the higher limit was used within a second"
    # Lowered, running tasks carry on (0.2 s each): within a second and their end, one at a time.
    assert sampler.most(since=lowered + 1.2) <= 1
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM tasks WHERE queue = 'tuned' AND status = 'PENDING'")
        assert cur.fetchone()[0] > 0, "the drain was still going when it was measured"


def test_limits_set_on_an_unlimited_queue_while_draining_and_removed_take_effect_within_a_second(stack):
    _, addr = stack.dispatcher(VALKA_DISPATCH_POLL_INTERVAL="30")
    _workers(stack, [addr], "switched", 2)  # 16 slots
    sampler = Sampler("switched")
    services.task_enqueue_many([{"task_name": "sleep", "queue": "switched", "input": {"seconds": 0.2}}] * 600)
    wait_for(lambda: TaskRun.objects.filter(task__queue="switched").count() >= 20, what="the drain under way")
    capped = time.monotonic()
    services.queue_update(name="switched", data={"max_running": 3})
    time.sleep(2.5)
    rated, rated_db = time.monotonic(), db_now()
    services.queue_update(name="switched", data={"max_running": None, "rate_limit": 5})
    time.sleep(3)
    freed, freed_db = time.monotonic(), db_now()
    services.queue_update(name="switched", data={"rate_limit": None})
    time.sleep(2)
    sampler.stop()
    assert sampler.most(until=capped) > 3, "unlimited at first"
    assert sampler.most(since=capped + 1, until=rated) <= 3, "max_running held within a second of being set"
    starts = [s for s, _, _ in _runs("switched") if rated_db + timedelta(seconds=1) <= s < freed_db]
    busiest = max((sum(1 for s in starts[i:] if s - start < timedelta(seconds=1)) for i, start in enumerate(starts)),
                  default=0)
    assert 0 < busiest <= 5, f"{busiest} starts in one second under rate_limit 5"
    assert sampler.most(since=freed + 1) > 5, "no limit again within a second of its removal"
    assert Task.objects.filter(queue="switched", status="PENDING").exists(), "still draining when measured"


def test_a_held_queue_never_has_more_tasks_running_than_its_workers_slots(stack):
    """VALKA_DISPATCH_HELD_QUEUES: a result frees its slot once its end is written, so the database
    never holds more of the queue's tasks DISPATCHING or RUNNING than the workers have slots, with no
    limit set. A queue not held, drained the same way beside it, runs past its slots: new tasks
    start while the ends of earlier ones wait in the dispatcher's writer."""
    _, addr = stack.dispatcher(VALKA_DISPATCH_HELD_QUEUES="held")
    stack.worker(addr, queues="held,free", concurrency=4, name="w")
    wait_for(lambda: Worker.objects.filter(status="CONNECTED").count() == 1, what="the worker")
    most = {}
    for queue in ("held", "free"):
        sampler = Sampler(queue, every=0.002)
        services.task_enqueue_many([{"task_name": "echo", "queue": queue}] * 1000)
        _completed(queue, 1000, timeout=120)
        sampler.stop()
        most[queue] = sampler.most()
    assert most["held"] == 4, most
    assert most["free"] > 4, most
    assert not Queue.objects.filter(name="held", max_running__isnull=False).exists()
