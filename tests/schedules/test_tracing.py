"""A schedule's slot starts a trace of its own when the scheduler traces (schedules/firing.py): a
`valka.enqueue` root span per slot, which the slot's task carries; none without a tracer provider.
A trigger by hand joins the trace of the call that triggered it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from schedules.firing import ScheduleFiring
from schedules.models import Schedule
from schedules.services import schedule_trigger
from tests.helpers import make_config, once
from tests.schedules.helpers import make_schedule, tasks_of
from valka_sdk.tracing import TRACEPARENT

pytestmark = pytest.mark.django_db(transaction=True)

BASE = datetime(2020, 1, 1, 10, 0, tzinfo=UTC)


def _fire(now: datetime) -> int:
    return once(ScheduleFiring(make_config(), grace=10.0), now=now)


def test_each_slot_is_a_trace_of_its_own(spans):
    make_schedule("every-minute", next_run_at=BASE, catch_up="all", metadata={"team": "ops"})
    make_schedule("own-context", next_run_at=BASE, metadata={TRACEPARENT: "00-aa-bb-01"})
    assert _fire(BASE + timedelta(minutes=1, seconds=1)) == 3
    first, second = tasks_of("every-minute")
    enqueues = [s for s in spans.get_finished_spans() if s.name == "valka.enqueue"]
    assert len(enqueues) == 3 and all(s.parent is None and s.kind == SpanKind.PRODUCER for s in enqueues)
    by_slot = {s.attributes["valka.slot"]: s for s in enqueues if s.attributes["valka.schedule"] == "every-minute"}
    for task in (first, second):
        span = by_slot[task.run_at.isoformat().replace("+00:00", "Z")]
        context = span.get_span_context()
        assert task.metadata == {"team": "ops", "valka.schedule": "every-minute", TRACEPARENT:
                                 f"00-{trace.format_trace_id(context.trace_id)}-"
                                 f"{trace.format_span_id(context.span_id)}-{context.trace_flags:02x}"}
        assert span.attributes["messaging.message.id"] == str(task.id)
        assert span.attributes["messaging.destination.name"] == "reports"
    assert first.metadata[TRACEPARENT].split("-")[1] != second.metadata[TRACEPARENT].split("-")[1]
    (own,) = tasks_of("own-context")
    assert own.metadata[TRACEPARENT] == "00-aa-bb-01", "a schedule's own valka.traceparent wins"


def test_a_slot_already_fired_is_marked_on_its_span(spans):
    make_schedule("again", next_run_at=BASE)
    assert _fire(BASE + timedelta(seconds=1)) == 1
    Schedule.objects.filter(name="again").update(next_run_at=BASE)  # as a second scheduler would find it
    assert _fire(BASE + timedelta(seconds=2)) == 0
    repeat = [s for s in spans.get_finished_spans() if s.name == "valka.enqueue"][-1]
    assert repeat.attributes["valka.existing"] is True and "messaging.message.id" not in repeat.attributes


def test_without_a_tracer_provider_a_slot_s_task_carries_no_context():
    make_schedule("plain", next_run_at=BASE)
    assert _fire(BASE + timedelta(seconds=1)) == 1
    (task,) = tasks_of("plain")
    assert task.metadata == {"valka.schedule": "plain"}


def test_a_trigger_joins_the_caller_s_trace(spans):
    make_schedule("by-hand", next_run_at=BASE + timedelta(days=1))
    with trace.get_tracer("admin").start_as_current_span("POST trigger") as caller:
        task = schedule_trigger(name="by-hand")
    enqueue = next(s for s in spans.get_finished_spans() if s.name == "valka.enqueue")
    assert enqueue.parent.span_id == caller.get_span_context().span_id
    assert task.metadata[TRACEPARENT].split("-")[2] == trace.format_span_id(enqueue.context.span_id)
