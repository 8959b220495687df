"""`GET /metrics`: Prometheus text format, computed from the database, at most once per
VALKA_METRICS_CACHE_SECONDS (10) in each process whatever the scrape rate, and without a write:
an endpoint that may be public must not let a busy or hostile scraper load the database.

Several dispatchers and web processes run at once and restart at will, so no
number here lives in a process. Gauges are read from the tables when scraped;
the `*_total` counters come from `task_counters` and `task_counter_deltas`, which a trigger
keeps in the same transaction as every insert and status change (tasks/sql/schema/counters.sql),
so they survive restarts and add up across nodes; so does `valka_queue_limited_total`, whose
counts each dispatcher adds there at most once a second. The two histograms describe a
recent window (`WINDOW_SECONDS`) and are exposed as gauge histograms: read their
buckets directly (`histogram_quantile(0.9, valka_run_duration_seconds_bucket)`),
without `rate()`. The statements are in tasks/sql/metrics.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from rest_framework.exceptions import AuthenticationFailed

from tasks import dashboard
from tasks.api.auth import ApiKeyAuthentication
from tasks.sql import metrics as sql
from tasks.states import ACTIVE_STATES, TaskStatus
from valka.conf import valka_settings

WINDOW_SECONDS = 300
LIMITED_KIND = "limited_"  # task_counters kinds of valka_queue_limited_total, one per limit (dispatcher/sql.py)
SAMPLE_LIMIT = 10_000  # at most this many runs per histogram per scrape
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

COUNTER_HELP = {
    "created": "Tasks created (including replays).",
    "completed": "Tasks that completed.",
    "failed": "Tasks that failed without a retry.",
    "retried": "Failed or lost attempts that were scheduled for a retry.",
    "dead_lettered": "Tasks that exhausted their retries.",
    "cancelled": "Tasks cancelled.",
}


def uuid7_floor(unix_seconds: float) -> uuid.UUID:
    """The smallest UUIDv7 minted at or after `unix_seconds`: a key range start for time-sorted ids."""
    return uuid.UUID(int=int(unix_seconds * 1000) << 80)


def _histogram(sample_sql: str, bounds: Sequence[float], params: dict[str, Any]) -> tuple[list[tuple[str, float]],
                                                                                          float]:
    columns = ", ".join(sql.HISTOGRAM_BUCKET.format(bound=float(b)) for b in bounds)
    with connection.cursor() as cursor:
        cursor.execute(sql.HISTOGRAM.format(buckets=columns, sample=sample_sql), params)
        total, total_sum, *cumulative = cursor.fetchone()
    buckets = [(repr(float(b)), float(n)) for b, n in zip(bounds, cumulative, strict=True)]
    buckets.append(("+Inf", float(total)))
    return buckets, float(total_sum)


class ValkaCollector:
    """Reads the queue's state from PostgreSQL on every scrape."""

    def collect(self) -> Iterator[Metric]:
        # Finished tasks are counted by the *_total counters: counting them here would read millions of rows.
        active = dashboard.status_counts(cap=None, statuses=sorted(s.value for s in ACTIVE_STATES))
        tasks = GaugeMetricFamily("valka_tasks", "Tasks in each non-final status, by queue.",
                                  labels=["queue", "status"])
        for queue, by_status in sorted(active.items()):
            for status, n in sorted(by_status.items()):
                tasks.add_metric([queue, status], n)
        yield tasks
        with connection.cursor() as cursor:
            cursor.execute(sql.WORKERS_CONNECTED)
            workers = cursor.fetchone()[0]
            cursor.execute(sql.QUEUES_PAUSED)
            paused = dict(cursor.fetchall())

        paused_family = GaugeMetricFamily("valka_queue_paused", "1 while the queue's pause is in force.",
                                          labels=["queue"])
        for queue, is_paused in paused.items():
            paused_family.add_metric([queue], float(is_paused))
        yield paused_family
        running = GaugeMetricFamily("valka_queue_running", "Tasks DISPATCHING or RUNNING (what max_running holds).",
                                    labels=["queue"])
        for queue in sorted(set(paused) | set(active)):
            by_status = active.get(queue, {})
            running.add_metric([queue], by_status.get(TaskStatus.DISPATCHING.value, 0)
                               + by_status.get(TaskStatus.RUNNING.value, 0))
        yield running

        lag = GaugeMetricFamily("valka_queue_lag_seconds", "Age of the oldest due PENDING task, by queue.",
                                labels=["queue"])
        for queue, seconds in sorted(dashboard.queue_lag().items()):
            lag.add_metric([queue], seconds or 0.0)
        yield lag

        yield GaugeMetricFamily("valka_workers_connected", "Workers connected to a dispatcher.", value=workers)

        totals = dashboard.counter_totals()
        for kind in dashboard.COUNTER_KINDS:
            family = CounterMetricFamily(f"valka_tasks_{kind}", COUNTER_HELP[kind], labels=["queue"])
            for (queue, k), n in sorted(totals.items()):
                if k == kind:
                    family.add_metric([queue], n)
            yield family
        limited = CounterMetricFamily("valka_queue_limited", "Claims a limit held back, by queue and limit.",
                                      labels=["queue", "reason"])
        for (queue, kind), n in sorted(totals.items()):
            if kind.startswith(LIMITED_KIND):
                limited.add_metric([queue, kind.removeprefix(LIMITED_KIND)], n)
        yield limited

        params = {"window": WINDOW_SECONDS, "limit": SAMPLE_LIMIT,
                  # a minute of slack for clocks of the dispatchers that minted the run ids
                  "low_id": uuid7_floor(time.time() - WINDOW_SECONDS - 60)}
        buckets, total = _histogram(sql.RECENT_DISPATCH_LATENCY, LATENCY_BUCKETS, params)
        yield GaugeHistogramMetricFamily(
            "valka_dispatch_latency_seconds",
            f"Due time to RUNNING, for runs started in the last {WINDOW_SECONDS} s.", buckets, total)
        buckets, total = _histogram(sql.RECENT_RUN_DURATION, DURATION_BUCKETS, params)
        yield GaugeHistogramMetricFamily(
            "valka_run_duration_seconds",
            f"Duration of the last run of tasks that finished in the last {WINDOW_SECONDS} s.", buckets, total)


registry = CollectorRegistry(auto_describe=False)
registry.register(ValkaCollector())


class Exposition:
    """The process's last computed exposition. Scrapes that arrive while it is being computed wait
    for it and share it, so a burst of scrapes costs one computation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._body = b""
        self._at: float | None = None
        self.computed = 0  # computations so far

    def get(self) -> bytes:
        with self._lock:
            if self._at is None or time.monotonic() - self._at >= valka_settings.METRICS_CACHE_SECONDS:
                self._body = generate_latest(registry)
                self._at = time.monotonic()
                self.computed += 1
            return self._body

    def forget(self) -> None:
        with self._lock:
            self._at = None


exposition = Exposition()


def _allowed(request: HttpRequest) -> bool:
    """Public unless VALKA_METRICS_PUBLIC is off; then an API key (any scope: it reads) or a staff
    session that may see tasks, as the admin's overview asks."""
    if valka_settings.METRICS_PUBLIC:
        return True
    user = request.user
    if user.is_authenticated and user.is_staff and user.has_perm("tasks.view_task"):
        return True
    try:
        return ApiKeyAuthentication().authenticate(request) is not None
    except AuthenticationFailed:
        return False


@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Public like /healthz unless VALKA_METRICS_PUBLIC=false (see `_allowed`)."""
    if not _allowed(request):
        response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = "Bearer"
        return response
    return HttpResponse(exposition.get(), content_type=CONTENT_TYPE_LATEST)
