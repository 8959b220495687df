"""A claim that found tasks is a `valka.claim` span, a trace of its own linked to its tasks' traces."""

import asyncio

import pytest
from opentelemetry import trace

from dispatcher.sql import CLAIM_SESSION
from tasks.services import task_enqueue, task_enqueue_many
from tests.dispatcher.test_claimer import Slots, _claimer
from valka.db import make_pool

pytestmark = pytest.mark.django_db(transaction=True)


async def _claim(queue: str) -> list[str]:
    slots = Slots(10)
    pool = make_pool("claim-span-test", min_size=1, max_size=1, session=CLAIM_SESSION)
    await pool.open()
    try:
        claimer = _claimer(slots, pool)
        await claimer.claim_queue(queue)
        await claimer.claim_queue(queue)  # nothing left: no span
    finally:
        await pool.close()
    return slots.sent


def test_a_claim_is_linked_not_parented_to_the_tasks_it_claimed(spans):
    with trace.get_tracer("caller").start_as_current_span("request"):
        traced = task_enqueue_many([{"task_name": "t", "queue": "floor"}] * 2)
    # A context that is not one (kept as its producer sent it): the claim links nothing for it.
    unlinked = task_enqueue(task_name="t", queue="floor", metadata={"valka.traceparent": "junk"})
    spans.clear()
    with trace.get_tracer("caller").start_as_current_span("unrelated") as unrelated:
        sent = asyncio.run(_claim("floor"))  # the claimer's loop runs in no caller's context
    assert sent == [str(t.id) for t in [*traced, unlinked]]
    claim, = [s for s in spans.get_finished_spans() if s.name.startswith("valka.claim")]
    assert claim.name == "valka.claim floor" and claim.parent is None
    assert claim.context.trace_id != unrelated.get_span_context().trace_id
    assert claim.attributes["messaging.batch.message_count"] == 3
    assert claim.attributes["messaging.destination.name"] == "floor"
    assert [(trace.format_span_id(link.context.span_id), link.attributes["messaging.message.id"])
            for link in claim.links] == [(t.metadata["valka.traceparent"].split("-")[2], str(t.id)) for t in traced]
