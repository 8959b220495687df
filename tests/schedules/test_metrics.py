"""/metrics says, for each schedule, how many slots it fired and how late its last one was, read from
the schedules table (so every web process answers the same)."""

from datetime import UTC, datetime, timedelta

import pytest

from schedules.firing import ScheduleFiring
from tasks.metrics import exposition
from tests.helpers import make_config, once
from tests.schedules.helpers import make_schedule

pytestmark = pytest.mark.django_db(transaction=True)

BASE = datetime(2020, 1, 1, 10, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fresh_exposition():
    exposition.forget()
    yield
    exposition.forget()


def test_fired_total_and_lag_per_schedule(client):
    make_schedule("nightly", next_run_at=BASE, catch_up="all")
    make_schedule("quiet", next_run_at=BASE + timedelta(days=1))
    make_schedule("team.a:daily-1", next_run_at=BASE, catch_up="none")
    once(ScheduleFiring(make_config(), grace=10.0), now=BASE + timedelta(minutes=2, seconds=1.5))

    text = client.get("/metrics").content.decode()
    assert "# TYPE valka_schedule_fired_total counter" in text
    assert 'valka_schedule_fired_total{schedule="nightly"} 3.0' in text
    assert 'valka_schedule_fired_total{schedule="quiet"} 0.0' in text
    assert 'valka_schedule_lag_seconds{schedule="nightly"} 1.5' in text
    assert 'valka_schedule_lag_seconds{schedule="quiet"}' not in text  # it never fired
    assert 'valka_schedule_fired_total{schedule="team.a:daily-1"} 1.0' in text
