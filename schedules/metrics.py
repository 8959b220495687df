"""What /metrics says of schedules, read from the rows the firing loop keeps (`fired_count`,
`last_lag_seconds`), so every web process answers the same and nothing lives in a process."""

from __future__ import annotations

from collections.abc import Iterator

from django.db import connection
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from schedules import sql


class ScheduleCollector:
    def collect(self) -> Iterator[Metric]:
        with connection.cursor() as cursor:
            cursor.execute(sql.METRICS)
            rows = cursor.fetchall()
        fired = CounterMetricFamily("valka_schedule_fired", "Slots each schedule fired (manual triggers not counted).",
                                    labels=["schedule"])
        lag = GaugeMetricFamily("valka_schedule_lag_seconds",
                                "Fire time minus slot time of the last slot each schedule fired.", labels=["schedule"])
        for name, count, seconds in rows:
            fired.add_metric([name], count)
            if seconds is not None:
                lag.add_metric([name], seconds)
        yield fired
        yield lag


COLLECTOR = ScheduleCollector()
_registered: set[int] = set()


def register(registry: CollectorRegistry) -> None:
    """Add the collector to `registry` once (tasks.metrics.registry, from SchedulesConfig.ready())."""
    if id(registry) not in _registered:
        registry.register(COLLECTOR)
        _registered.add(id(registry))
