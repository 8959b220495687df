"""Slot arithmetic (schedules.slots) against the cron library itself, intervals, and both DST
changes in Europe/Berlin and America/New_York. Every time is given: nothing reads a clock."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from schedules.slots import MACROS, SlotError, Timing, cron_fields, key_time, zone

BERLIN, NEW_YORK = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")


def walk(timing: Timing, start: datetime, count: int) -> list[datetime]:
    """`count` slots from the first one at or after `start`, one `after` at a time."""
    slots = [timing.first(now=start)]
    while len(slots) < count:
        slots.append(timing.after(slots[-1]))
    return slots


def library(expression: str, tz: ZoneInfo, start: datetime, count: int) -> list[datetime]:
    it = CronSim(expression, (start - timedelta(seconds=1)).astimezone(tz))
    return [next(it).astimezone(UTC) for _ in range(count)]


@pytest.mark.parametrize("expression", ["*/7 * * * *", "30 2 * * *", "0 * * * *", "15 1-3 * * 1-5", "0 0 L * *",
                                        "0 9 * * MON#2", "45 23 31 12 *"])
@pytest.mark.parametrize("tz", [BERLIN, NEW_YORK, ZoneInfo("UTC")], ids=str)
def test_cron_slots_are_the_librarys_through_a_year_of_dst_changes(expression, tz):
    start = datetime(2026, 1, 1, tzinfo=UTC)
    timing = Timing(cron_fields(expression), None, str(tz))
    count = 60 if expression.startswith("*/7") else 400
    assert walk(timing, start, count) == library(expression, tz, start, count)


def test_macros_are_their_five_fields():
    assert cron_fields("@daily") == cron_fields("0 0 * * *") == "0 0 * * *"
    assert cron_fields(" @HOURLY ") == "0 * * * *"
    assert {cron_fields(m) for m in ("@hourly", "@daily", "@weekly", "@monthly", "@yearly")} <= set(MACROS.values())
    timing = Timing(cron_fields("@weekly"), None, "Europe/Berlin")
    assert timing.first(now=datetime(2026, 3, 25, tzinfo=UTC)) == datetime(2026, 3, 28, 23, tzinfo=UTC)  # Sun 00:00


@pytest.mark.parametrize("expression", ["* * * *", "* * * * * *", "61 * * * *", "* 24 * * *", "0 0 30 2 *", "@often",
                                        "*/0 * * * *", "a b c d e", "5-1 * * * *"])
def test_a_bad_expression_is_refused_naming_cron(expression):
    with pytest.raises(SlotError) as err:
        cron_fields(expression)
    assert err.value.field == "cron" and err.value.problem


def test_an_unknown_time_zone_is_refused():
    assert zone("UTC") is UTC and zone("Europe/Berlin") == BERLIN
    for name in ("Mars/Olympus", "CEST", "../etc/passwd", ""):
        with pytest.raises(SlotError) as err:
            zone(name)
        assert err.value.field == "timezone"


def berlin(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=BERLIN, fold=fold).astimezone(UTC)


def new_york(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=NEW_YORK, fold=fold).astimezone(UTC)


def test_spring_forward_a_skipped_time_fires_once_when_the_clock_jumps():
    # Berlin, 29 March 2026: 02:00 CET becomes 03:00 CEST. New York, 8 March 2026: 02:00 EST → 03:00 EDT.
    daily = Timing(cron_fields("30 2 * * *"), None, "Europe/Berlin")
    assert walk(daily, berlin(2026, 3, 28, 12), 3) == [berlin(2026, 3, 29, 3, 0), berlin(2026, 3, 30, 2, 30),
                                                       berlin(2026, 3, 31, 2, 30)]
    daily = Timing(cron_fields("30 2 * * *"), None, "America/New_York")
    assert walk(daily, new_york(2026, 3, 7, 12), 2) == [new_york(2026, 3, 8, 3, 0), new_york(2026, 3, 9, 2, 30)]
    # Hourly slots follow real time: the hour that does not exist has none.
    hourly = Timing(cron_fields("0 * * * *"), None, "Europe/Berlin")
    assert walk(hourly, berlin(2026, 3, 29, 1, 0), 3) == [berlin(2026, 3, 29, 1), berlin(2026, 3, 29, 3),
                                                          berlin(2026, 3, 29, 4)]
    assert [b - a for a, b in zip(walk(hourly, berlin(2026, 3, 29, 0), 4)[:-1], walk(hourly, berlin(2026, 3, 29, 0),
                                                                                      4)[1:], strict=True)] \
        == [timedelta(hours=1)] * 3


def test_fall_back_a_repeated_time_fires_once_an_hourly_one_twice():
    # Berlin, 25 October 2026: 03:00 CEST becomes 02:00 CET. New York, 1 November 2026: 02:00 EDT → 01:00 EST.
    daily = Timing(cron_fields("30 2 * * *"), None, "Europe/Berlin")
    assert walk(daily, berlin(2026, 10, 24, 12), 3) == [berlin(2026, 10, 25, 2, 30), berlin(2026, 10, 26, 2, 30),
                                                        berlin(2026, 10, 27, 2, 30)]
    assert berlin(2026, 10, 25, 2, 30) == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # the first 02:30 (CEST)
    daily = Timing(cron_fields("30 1 * * *"), None, "America/New_York")
    assert walk(daily, new_york(2026, 10, 31, 12), 2) == [new_york(2026, 11, 1, 1, 30), new_york(2026, 11, 2, 1, 30)]
    assert new_york(2026, 11, 1, 1, 30) == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # the first 01:30 (EDT)
    hourly = Timing(cron_fields("0 * * * *"), None, "Europe/Berlin")
    assert walk(hourly, berlin(2026, 10, 25, 1, 0), 4) == [
        berlin(2026, 10, 25, 1), berlin(2026, 10, 25, 2), berlin(2026, 10, 25, 2, fold=1), berlin(2026, 10, 25, 3)]
    hourly = Timing(cron_fields("0 * * * *"), None, "America/New_York")
    assert walk(hourly, new_york(2026, 11, 1, 0), 4) == [
        new_york(2026, 11, 1, 0), new_york(2026, 11, 1, 1), new_york(2026, 11, 1, 1, fold=1), new_york(2026, 11, 1, 2)]
    # Made inside the repeated hour, after its first 01:30: the next is the next day's.
    daily = Timing(cron_fields("30 1 * * *"), None, "America/New_York")
    assert daily.first(now=new_york(2026, 11, 1, 1, 10, fold=1)) == new_york(2026, 11, 2, 1, 30)


def test_due_slots_across_a_gap_come_from_forward_iteration():
    every_minute = Timing(cron_fields("* * * * *"), None)
    base = datetime(2030, 1, 1, 10, 0, tzinfo=UTC)
    slots, following = every_minute.due(next_run_at=base, now=base + timedelta(minutes=5, seconds=30), keep=100)
    assert slots == [base + timedelta(minutes=m) for m in range(6)] and following == base + timedelta(minutes=6)
    slots, following = every_minute.due(next_run_at=base, now=base + timedelta(days=40, seconds=1), keep=3)
    assert slots == [base + timedelta(days=40, minutes=m) for m in (-2, -1, 0)]
    assert following == base + timedelta(days=40, minutes=1)
    assert every_minute.due(next_run_at=base, now=base - timedelta(seconds=1), keep=1) == ([], base)
    # Across both Berlin changes, the slots of a long gap are those of walking one by one.
    daily = Timing(cron_fields("30 2 * * *"), None, "Europe/Berlin")
    start = daily.first(now=berlin(2026, 3, 1))
    everything = walk(daily, start, 250)
    slots, following = daily.due(next_run_at=start, now=everything[-1] + timedelta(hours=1), keep=100)
    assert slots == everything[-100:] and following == daily.after(everything[-1])


def test_interval_slots_are_one_chain_from_their_anchor():
    start = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
    hourly = Timing(None, 3600, "Europe/Berlin", start_at=start)
    assert hourly.first(now=start - timedelta(days=1)) == start
    assert hourly.first(now=start + timedelta(minutes=90)) == start + timedelta(hours=2)
    no_start = Timing(None, 90, "UTC")
    assert no_start.first(now=start) == start + timedelta(seconds=90)
    # DST does not move an interval: 24 slots a day whatever the wall clock does.
    dst = Timing(None, 3600, "Europe/Berlin", start_at=berlin(2026, 3, 29, 0))
    assert walk(dst, berlin(2026, 3, 29, 0), 25)[-1] - berlin(2026, 3, 29, 0) == timedelta(hours=24)
    slots, following = no_start.due(next_run_at=start, now=start + timedelta(minutes=10), keep=2)
    assert slots == [start + timedelta(seconds=450), start + timedelta(seconds=540)]
    assert following == start + timedelta(seconds=630)


def test_no_slot_before_start_at_or_after_end_at():
    start, end = datetime(2030, 1, 1, 10, 0, tzinfo=UTC), datetime(2030, 1, 1, 10, 3, tzinfo=UTC)
    every_minute = Timing(cron_fields("* * * * *"), None, "UTC", start_at=start, end_at=end)
    assert every_minute.first(now=start - timedelta(days=3)) == start
    assert every_minute.upcoming(now=start - timedelta(days=3), next_run_at=start) == [
        start + timedelta(minutes=m) for m in range(4)]
    assert every_minute.after(end) is None
    slots, following = every_minute.due(next_run_at=start, now=end + timedelta(hours=1), keep=100)
    assert slots == [start + timedelta(minutes=m) for m in range(4)] and following is None
    ticking = Timing(None, 60, "UTC", start_at=start, end_at=end)
    assert ticking.due(next_run_at=start, now=end + timedelta(hours=1), keep=100) == (
        [start + timedelta(minutes=m) for m in range(4)], None)
    assert ticking.first(now=end + timedelta(seconds=1)) is None


def test_the_key_time_is_utc_to_the_second():
    assert key_time(berlin(2026, 3, 29, 3, 0)) == "2026-03-29T01:00:00Z"
    assert key_time(datetime(2030, 1, 1, 0, 0, 5, 999, tzinfo=UTC)) == "2030-01-01T00:00:05Z"
