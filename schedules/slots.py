"""When a schedule fires: its slots, computed with cronsim (cron) or arithmetic (intervals).

A schedule's *slots* are the instants it is due, in UTC:

- a cron schedule's are the times whose wall-clock reading in the schedule's time zone matches
  the expression (5 fields, or a macro of MACROS), as Debian's cron has it, which cronsim follows
  across DST changes: a time that a spring-forward change skips (02:30 in Europe/Berlin on the
  last Sunday of March) fires once when the clock jumps (03:00); a time that a fall-back change
  repeats fires once, at its first occurrence, for an expression that names its minute and hour
  (`30 2 * * *`), but on both occurrences for one that runs every hour or more often (`0 * * * *`
  fires at 02:00 CEST and at 02:00 CET, an hour apart in real time);
- an interval schedule's are one chain `anchor + k × interval`: its anchor is `start_at` when it
  has one, else the time it was made (or its interval last changed), and its first slot one
  interval after that; time zones do not move it.

Neither has slots before `start_at` or after `end_at`. Every function takes the time it
reasons about (`now`, `after`) as an argument: nothing here reads a clock.
"""

from __future__ import annotations

import functools
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

from cronsim import CronSim, CronSimError

# The macros a cron expression may be, and the 5 fields each stands for.
MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
SECOND = timedelta(seconds=1)
# How far a DST change can move a cron slot from where reverse iteration finds it.
DST_MARGIN = timedelta(hours=2)


class SlotError(ValueError):
    """A schedule's timing that cannot work (its message says why, for the field it names)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@functools.lru_cache(maxsize=1024)
def cron_fields(expression: str) -> str:
    """The five fields `expression` stands for (a macro expanded), checked by cronsim; SlotError if invalid."""
    text = " ".join(expression.split())
    fields = MACROS.get(text.lower(), text)
    if fields.startswith("@"):
        raise SlotError("cron", f"unknown macro {text!r} (known: {', '.join(MACROS)})")
    if len(fields.split()) != 5:
        raise SlotError("cron", "must have 5 fields (minute hour day-of-month month day-of-week) or be a macro")
    try:
        it = CronSim(fields, datetime(2000, 1, 1, tzinfo=UTC))
        next(it)
    except (CronSimError, ValueError, IndexError) as exc:
        raise SlotError("cron", str(exc) or "invalid cron expression") from None
    except StopIteration:
        raise SlotError("cron", "never matches a date") from None
    return fields


@functools.cache
def zone(name: str) -> tzinfo:
    """The IANA time zone `name` (UTC as datetime.UTC, which cronsim treats without DST work);
    SlotError if unknown."""
    if name == "UTC":
        return UTC
    if name not in _zone_names():
        raise SlotError("timezone", f"unknown time zone {name!r} (an IANA name, e.g. Europe/Berlin)")
    return zoneinfo.ZoneInfo(name)


@functools.cache
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


@dataclass(frozen=True, slots=True)
class Timing:
    """What decides a schedule's slots. `cron` holds five fields (see `cron_fields`)."""

    cron: str | None
    interval_seconds: int | None
    timezone: str = "UTC"
    start_at: datetime | None = None
    end_at: datetime | None = None

    def first(self, *, now: datetime) -> datetime | None:
        """The first slot of a schedule made (or whose timing changed) at `now`: the first cron
        slot at or after max(now, start_at); for an interval, the first slot of its chain at or
        after `now` (anchored at start_at, else one interval after now). None if there is none."""
        if self.interval_seconds is not None:
            step = timedelta(seconds=self.interval_seconds)
            if self.start_at is None:
                return self._bounded(now + step)
            if self.start_at >= now:
                return self._bounded(self.start_at)
            k = -(-(now - self.start_at) // step)  # ceil
            return self._bounded(self.start_at + k * step)
        begin = max(now, self.start_at) if self.start_at else now
        return self._bounded(next(self._cron_from(_ceil_second(begin) - SECOND), None))

    def after(self, slot: datetime) -> datetime | None:
        """The slot after `slot` (one of this timing's slots), or None past end_at."""
        if self.interval_seconds is not None:
            return self._bounded(slot + timedelta(seconds=self.interval_seconds))
        return self._bounded(next(self._cron_from(slot), None))

    def due(self, *, next_run_at: datetime, now: datetime, keep: int) -> tuple[list[datetime], datetime | None]:
        """The slots due at `now` from `next_run_at` (a slot) on: the last `keep` of those in
        [next_run_at, now], oldest first, and the first slot after `now` (None: no more)."""
        if next_run_at > now:
            return [], next_run_at
        if self.interval_seconds is not None:
            step = timedelta(seconds=self.interval_seconds)
            until = now if self.end_at is None else min(now, self.end_at)
            if until < next_run_at:
                return [], self._bounded(next_run_at)
            count = (until - next_run_at) // step + 1
            first_kept = max(count - keep, 0)
            slots = [next_run_at + k * step for k in range(first_kept, count)]
            return slots, self._bounded(next_run_at + count * step)
        start = next_run_at
        if now - next_run_at > DST_MARGIN:
            # A long gap: start a little before the `keep`-th slot back from now instead of walking
            # every slot since next_run_at. The slots themselves come from forward iteration.
            earliest = next_run_at
            for n, slot in enumerate(self._cron_back_from(now), start=1):
                if slot < next_run_at:
                    break
                earliest = slot
                if n == keep:
                    break
            start = max(next_run_at, earliest - DST_MARGIN)
        slots: list[datetime] = []
        following = None
        for slot in self._cron_from(start - SECOND):
            if slot < next_run_at:
                continue
            if slot > now or (self.end_at is not None and slot > self.end_at):
                following = slot
                break
            slots.append(slot)
            if len(slots) > keep:
                del slots[0]
        return slots, self._bounded(following)

    def upcoming(self, *, now: datetime, next_run_at: datetime | None, count: int = 5) -> list[datetime]:
        """The first `count` slots at or after `now` (an interval's chain as next_run_at anchors it)."""
        if self.interval_seconds is not None and next_run_at is not None:
            step = timedelta(seconds=self.interval_seconds)
            first = next_run_at if next_run_at >= now else next_run_at + -(-(now - next_run_at) // step) * step
        else:
            first = self.first(now=now)
        found: list[datetime] = []
        slot = self._bounded(first)
        while slot is not None and len(found) < count:
            found.append(slot)
            slot = self.after(slot)
        return found

    def _bounded(self, slot: datetime | None) -> datetime | None:
        if slot is None or (self.end_at is not None and slot > self.end_at):
            return None
        return slot

    def _cron_from(self, after: datetime) -> Iterator[datetime]:
        """Cron slots strictly after `after` (whole seconds), in UTC, for 50 years at most (cronsim's
        horizon). Inside a repeated hour cronsim reckons in wall-clock time, so a slot it finds may lie
        before `after` in real time: such a slot has passed and is left out."""
        assert self.cron is not None
        for slot in CronSim(self.cron, after.astimezone(zone(self.timezone))):
            slot = slot.astimezone(UTC)
            if slot > after:
                yield slot

    def _cron_back_from(self, now: datetime) -> Iterator[datetime]:
        """Cron slots at or before `now`, latest first, in UTC (reverse iteration: only to find where to
        start, since the slots fired are always those of forward iteration)."""
        assert self.cron is not None
        for slot in CronSim(self.cron, (now + timedelta(microseconds=1)).astimezone(zone(self.timezone)),
                            reverse=True):
            yield slot.astimezone(UTC)


def _ceil_second(t: datetime) -> datetime:
    return t if t.microsecond == 0 else t.replace(microsecond=0) + SECOND


def key_time(slot: datetime) -> str:
    """A slot as its idempotency key writes it: UTC, ISO 8601, to the second (`2026-03-29T01:00:00Z`)."""
    return slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
