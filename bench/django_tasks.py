"""Django's task API on Valka: `Task.enqueue()` in a loop, in process and over REST, each beside
the call it wraps measured in the same way (`valka.enqueue`; `Client.create_task`, one caller on
one keep-alive connection), and the drain of no-op `@task` functions by one `valka_worker`.

Targets (in one run): `Task.enqueue()` at least 80% of the call it wraps; the drain at least
5× django-tasks-db's `db_worker` on the same workload (bench.peers.django_tasks_db_bench).
"""

from __future__ import annotations

import time
from typing import Any

from bench.measure import bar

DRAIN_QUEUE = "django-drain"
ENQUEUE_QUEUE = "enqueue"  # no worker takes it; bench.enqueue.cleanup() empties it
NOOP = "bench.django_jobs.noop"


def _rate(count: int, seconds: float) -> float:
    return count / seconds


TURNS = 10  # turns of each side in a comparison (see `_in_turns`)


def _timed(count: int, desc: str, call: Any) -> float:
    with bar(count, desc) as progress:
        start = time.perf_counter()
        for _ in range(count):
            call()
            progress.update(1)
        return time.perf_counter() - start


def _in_turns(count: int, sides: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """Each of `sides` (label → call) called `count` times in all, in TURNS turns that alternate
    with the other side's; answers the calls per side and the seconds each side took. Each commit
    waits for the disk, whose slow flushes come in bursts: with two turns a side, four consecutive
    measurements of the same code in a slow phase of the machine gave ratios from 0.68 to 1.03, as
    a burst fell on one side or the other. Shorter turns share a burst out between the sides."""
    each = max(count // TURNS, 1)
    seconds = dict.fromkeys(sides, 0.0)
    for turn in range(TURNS):
        for label, call in sides.items():
            seconds[label] += _timed(each, f"{label} {turn + 1}/{TURNS}", call)
    return each * TURNS, seconds


def enqueue_in_process(count: int) -> dict[str, Any]:
    """`noop.enqueue()` through the in-process backend, and `valka.enqueue` of the same task,
    in turns (`_in_turns`: the machine's speed drifts)."""
    import valka
    from bench.django_jobs import noop

    task = noop.using(queue_name=ENQUEUE_QUEUE)
    n, seconds = _in_turns(count, {
        "Task.enqueue() in-process": task.enqueue,
        "valka.enqueue (beside it)": lambda: valka.enqueue(NOOP, queue=ENQUEUE_QUEUE,
                                                          input={"args": [], "kwargs": {}})})
    django_s, valka_s = seconds.values()
    return {"rate_per_s": _rate(n, django_s), "valka_enqueue_rate_per_s": _rate(n, valka_s),
            "ratio": valka_s / django_s, "count": n}


def enqueue_remote(url: str, api_key: str, count: int) -> dict[str, Any]:
    """`noop.enqueue()` through the REST backend (outside a transaction: one POST each), and
    `Client.create_task` of the same body, in turns (`_in_turns`)."""
    from django.test.utils import override_settings

    from bench.django_jobs import noop
    from valka_sdk import Client

    remote = {"BACKEND": "valka_sdk.django.ValkaBackend", "QUEUES": [],
              "OPTIONS": {"URL": url, "API_KEY": api_key}}
    with override_settings(TASKS={"default": remote}), Client(url, api_key=api_key) as client:
        task = noop.using(queue_name=ENQUEUE_QUEUE)
        task.enqueue()  # both connections are open before the timing starts
        client.create_task(NOOP, queue=ENQUEUE_QUEUE)
        n, seconds = _in_turns(count, {
            "Task.enqueue() over REST": task.enqueue,
            "REST create (beside it)": lambda: client.create_task(
                NOOP, queue=ENQUEUE_QUEUE, input={"args": [], "kwargs": {}}, priority=0)})
    django_s, rest_s = seconds.values()
    return {"rate_per_s": _rate(n, django_s), "rest_create_rate_per_s": _rate(n, rest_s),
            "ratio": rest_s / django_s, "count": n}
