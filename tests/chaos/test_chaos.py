"""The short chaos run of the test suite (`make chaos` runs the long one)."""

import tempfile
from pathlib import Path

import pytest

from tests.chaos.harness import run_chaos


@pytest.mark.long
@pytest.mark.timeout(300)
def test_nothing_is_lost_when_everything_breaks():
    before = set(Path(tempfile.gettempdir()).glob("valka-chaos-*"))
    report = run_chaos(tasks=1000, workers=4, seconds=120, seed=7)
    print(report.summary())
    assert report.problems == [], report.summary()
    assert report.kills.get("postgres restart") == 1
    assert sum(report.statuses.values()) == 1000
    assert report.executions >= 1000 - report.cancelled
    assert report.recovery_after_pg_restart is not None
    # A clean run leaves neither its logs nor its cluster behind.
    assert set(Path(tempfile.gettempdir()).glob("valka-chaos-*")) <= before
