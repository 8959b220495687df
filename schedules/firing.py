"""The firing loop: the scheduler leader creates each schedule's task once per slot.

A pass takes due schedules a batch at a time, one transaction each (`schedules.sql`): it
locks the batch with SKIP LOCKED, works out in Python which slots each schedule fires and its
next slot (`schedules.slots`, cronsim for cron), inserts every task of the batch with one
`INSERT_TASKS`, and advances every schedule with one `ADVANCE_SCHEDULES`, before the commit.
Each task's idempotency key is `schedule:<name>:<slot in UTC>`: a leader killed mid-batch
rolls the whole batch back, and a second scheduler or a batch run again finds the key taken,
so no slot ever has two tasks.

Which due slots fire follows the schedule's `catch_up`: `all` every one (the last
MAX_CATCH_UP of them), `latest` the most recent only, `none` the most recent only if it is
less than `grace` late (a slot later than that was missed: the scheduler was down, or the
schedule disabled). On time, a pass finds one slot due per schedule, and all three agree.

With a tracer provider set in the scheduler, each slot's task starts a trace of its own at a
`valka.enqueue` span, which every attempt of that task joins; without one, its task carries no
trace context (docs/tracing.md).

A pass pauses between full batches (YIELD), so that a burst of due slots leaves the database
to the queues' work for part of the time.

Between passes the loop sleeps until the earliest `next_run_at` (one probe of an index), and
a trigger on the schedules table wakes it with a NOTIFY when a schedule is added, enabled or
moved earlier; a poll every `poll_interval` backs that up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span
from psycopg_pool import AsyncConnectionPool

from schedules import sql
from schedules.models import CatchUp
from schedules.slots import SlotError, Timing, cron_fields, key_time
from schedules.specs import SCHEDULE_KEY
from tasks.scheduler.base import DB, DUE_SLACK, MIN_SLEEP, Loop, SchedulerConfig, connection
from tasks.sql import producer
from valka.arrays import BinaryArray
from valka.conf import valka_settings
from valka.db import conninfo
from valka.ids import uuid7_many
from valka.listen import Listener
from valka_sdk import tracing

log = logging.getLogger("valka.scheduler")

MAX_CATCH_UP = 100  # slots one schedule with catch_up "all" fires after a gap: the most recent ones
MAX_TASKS_PER_BATCH = 5_000  # a batch stops taking schedules past this many tasks (catch-ups of "all")
# Between two full batches the loop pauses this many times the last one's length. A minute's
# 10,000 slots took the two cores of the benchmark's machine for a second and a quarter, and a
# drain beside them ran a quarter slower; paced, they fire within three seconds of their slot
# and the drain beside them keeps its pace (docs/performance.md).
YIELD = 1.5


@dataclass(slots=True)
class Firing:
    """What one due schedule does this pass: the slots it fires and its next slot."""

    slots: list[datetime]
    next_run_at: datetime | None


def plan(*, cron: str | None, interval_seconds: int | None, timezone: str, catch_up: str,
         start_at: datetime | None, end_at: datetime | None, next_run_at: datetime, now: datetime,
         grace: float) -> Firing:
    """The slots a due schedule fires at `now` and its next slot (see the module's docstring)."""
    timing = Timing(cron_fields(cron) if cron else None, interval_seconds, timezone, start_at, end_at)
    keep = MAX_CATCH_UP if catch_up == CatchUp.ALL else 1
    slots, following = timing.due(next_run_at=next_run_at, now=now, keep=keep)
    if catch_up == CatchUp.NONE and slots and (now - slots[-1]).total_seconds() > grace:
        slots = []
    return Firing(slots, following)


class ScheduleFiring(Loop):
    name = "schedules"

    def __init__(self, config: SchedulerConfig | None = None, pool: AsyncConnectionPool | None = None, *,
                 listen: str | None = None, grace: float = 10.0, poll_interval: float = 10.0) -> None:
        """`listen`: the conninfo of a LISTEN connection for the table's wake-ups (None: poll only)."""
        super().__init__(config, pool)
        self.listen = listen
        self.grace = grace
        self.poll_interval = poll_interval

    async def batch(self, conn: psycopg.AsyncConnection, now: datetime | None = None) -> tuple[int, int]:
        """Up to one batch of due schedules fired and advanced, in the caller's transaction.
        Returns (schedules looked at, tasks created)."""
        cur = await conn.execute(sql.DUE_SCHEDULES, {"now": now, "limit": self.config.batch_size})
        rows = await cur.fetchall()
        if not rows:
            return 0, 0
        ids: list[int] = []
        nexts: list[datetime | None] = []
        firings: list[list[datetime]] = []
        texts: list[str] = []  # each task of the batch as INSERT_TASKS's JSON, but for its id
        # Schedules with the same timing due at the same slot (a burst at the top of the hour) fire the
        # same slots: each distinct one is worked out once per batch, whose clock is one.
        planned: dict[tuple[Any, ...], Firing] = {}
        for (schedule_id, name, cron, interval, tz, catch_up, start_at, end_at, next_run_at, template,
             clock) in rows:
            timing = (cron, interval, tz, catch_up, start_at, end_at, next_run_at)
            firing = planned.get(timing)
            if firing is None:
                try:
                    firing = plan(cron=cron, interval_seconds=interval, timezone=tz, catch_up=catch_up,
                                  start_at=start_at, end_at=end_at, next_run_at=next_run_at, now=clock,
                                  grace=self.grace)
                except SlotError as exc:  # stored before this version refused it: stop it, loudly
                    log.error("%s: schedule %r cannot be computed (%s); it will not fire until its timing is "
                              "changed", self.name, name, exc)
                    firing = Firing([], None)
                planned[timing] = firing
            ids.append(schedule_id)
            nexts.append(firing.next_run_at)
            firings.append(firing.slots)
            head = template[:-1]  # the template object without its closing brace
            for slot in firing.slots:
                when = key_time(slot)
                texts.append(f'{head},"idempotency_key":"schedule:{name}:{when}","run_at":"{when}"')
            if len(texts) >= MAX_TASKS_PER_BATCH:
                break
        tracer = tracing.tracer()
        spans = _trace_slots(tracer, texts) if tracer is not None else None
        task_ids = [str(task_id) for task_id in uuid7_many(len(texts))]
        inserted: set[str] = set()
        if texts:
            body = "[" + ",".join(f'{text},"id":"{task_id}"}}' for text, task_id in zip(texts, task_ids,
                                                                                          strict=True)) + "]"
            cur = await conn.execute(producer.INSERT_TASKS, {"tasks": body})
            row = await cur.fetchone()
            inserted = set(row[0].split(",")) if row and row[0] else set()
        if spans is not None:
            _end_slot_spans(spans, task_ids, inserted)
        last_slots, last_tasks, fired = _outcomes(firings, task_ids, inserted)
        await conn.execute(sql.ADVANCE_SCHEDULES, {
            "now": now, "ids": BinaryArray(ids), "next_run_at": BinaryArray(nexts), "slots": BinaryArray(last_slots),
            "task_ids": BinaryArray(last_tasks), "fired": BinaryArray(fired)})
        taken = len(texts) - len(inserted)
        if taken:
            log.info("%s: %d slot(s) already had their task (another scheduler, or a batch repeated)", self.name,
                     taken)
        return len(rows), len(inserted)

    async def run_once(self, db: DB, now: datetime | None = None) -> int:
        """Batches until none is full; between full batches, a pause of YIELD times the last one's
        length, so that a burst of slots shares the database with the queues' work."""
        created = 0
        async with connection(db) as conn:
            while True:
                began = time.monotonic()
                async with conn.transaction():
                    looked_at, made = await self.batch(conn, now)
                created += made
                if looked_at < self.config.batch_size or self.stopping:
                    break
                await asyncio.sleep((time.monotonic() - began) * YIELD)
        return self.report(**{"scheduled tasks created": created})

    async def next_delay(self, db: DB) -> float:
        """Until the earliest slot (just after it), at most `poll_interval`."""
        async with connection(db) as conn:
            row = await (await conn.execute(sql.NEXT_DUE)).fetchone()
        due = row[0] if row else None
        if due is None:
            return self.poll_interval
        return min(self.poll_interval, max(MIN_SLEEP, due + DUE_SLACK))

    async def run(self, stop: asyncio.Event) -> None:
        """The loop, with a LISTEN connection (when `listen` is set) whose NOTIFYs cut its sleep short."""
        if self.listen is None:
            await super().run(stop)
            return
        listener = Listener(self.listen, {sql.SCHEDULES_CHANGED: lambda _payload: self.wake.set()},
                            on_reconnect=self.wake.set)
        listening = asyncio.create_task(listener.run(stop), name=f"{self.name} LISTEN")
        try:
            await super().run(stop)
        finally:
            await listening


def _trace_slots(tracer: trace.Tracer, texts: list[str]) -> list[Span]:
    """Each slot's task in a trace of its own, rooted at a `valka.enqueue` span (the firing has no
    caller to follow): its attempts join that trace. Rewrites `texts` in place so that each task
    carries its span's context, unless the schedule's metadata names a `valka.traceparent` itself."""
    spans = []
    for i, text in enumerate(texts):
        task = json.loads(text + "}")
        span = tracer.start_span("valka.enqueue", context=Context(), kind=trace.SpanKind.PRODUCER,
                                 attributes=tracing.messaging(task["queue"], **{
                                     "messaging.operation.type": "send", "messaging.operation.name": "enqueue",
                                     "valka.task_name": task["task_name"],
                                     "valka.schedule": task["metadata"].get(SCHEDULE_KEY),
                                     "valka.slot": task["run_at"]}))
        spans.append(span)
        if tracing.TRACEPARENT not in task["metadata"]:
            task["metadata"].update(tracing.carrier(trace.set_span_in_context(span)))
            texts[i] = json.dumps(task, ensure_ascii=False)[:-1]
    return spans


def _end_slot_spans(spans: list[Span], task_ids: Sequence[str], inserted: set[str]) -> None:
    for span, task_id in zip(spans, task_ids, strict=True):
        if task_id in inserted:
            span.set_attribute("messaging.message.id", task_id)
        else:
            span.set_attribute("valka.existing", True)  # the slot had its task already
        span.end()


def _outcomes(firings: Sequence[list[datetime]], task_ids: Sequence[str],
              inserted: set[str]) -> tuple[list[datetime | None], list[str | None], list[int]]:
    """Per schedule, in order: the slot of its last new task, that task's id, and how many it created."""
    last_slots: list[datetime | None] = []
    last_tasks: list[str | None] = []
    fired: list[int] = []
    i = 0
    for slots in firings:
        slot, task, count = None, None, 0
        for s in slots:
            if task_ids[i] in inserted:
                slot, task, count = s, task_ids[i], count + 1
            i += 1
        last_slots.append(slot)
        last_tasks.append(task)
        fired.append(count)
    return last_slots, last_tasks, fired


def from_settings(config: SchedulerConfig, pool: AsyncConnectionPool) -> ScheduleFiring:
    """The loop as `run_scheduler` runs it (registered in tasks.scheduler.extensions.LOOPS)."""
    return ScheduleFiring(config, pool, grace=float(valka_settings.SCHEDULE_MISFIRE_GRACE),
                          poll_interval=float(valka_settings.SCHEDULE_POLL_INTERVAL),
                          listen=conninfo(application_name=f"valka-scheduler {os.getpid()} schedules", direct=True))
