"""The dispatcher's writer against the test database, without gRPC."""

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from django.db import connection

from dispatcher import sql
from dispatcher.protocol import Result
from dispatcher.relay import Relay
from dispatcher.session import InFlight, SessionRegistry
from dispatcher.writer import Writer, WriterSettings
from tasks.models import Task, TaskRun
from tests.factories import SignalFactory, TaskFactory, TaskRunFactory
from tests.helpers import database_url, no_event_watchers_left
from valka.db import make_pool

pytestmark = pytest.mark.django_db(transaction=True)


def _writer(pool, cancel=lambda task_id, why: None) -> Writer:
    """A writer on its own, with the collaborators a node would give it."""
    return Writer(pool=pool, relay=Relay(pool=pool, sessions=SessionRegistry()), cancel=cancel,
                  settings=WriterSettings(node_id="test-node", lease_extension=60,
                                          retry_params={"retry_base": 1, "retry_cap": 10, "retry_jitter": 0.25}))


@contextlib.asynccontextmanager
async def _own_writer(max_size: int = 2) -> AsyncIterator[Writer]:
    """A writer on a pool of its own, closed on leaving (its backends then exit)."""
    pool = make_pool("writer-test", min_size=1, max_size=max_size, session=sql.WRITER_SESSION)
    await pool.open()
    try:
        yield _writer(pool)
    finally:
        await pool.close()


@contextlib.asynccontextmanager
async def _running_writer() -> AsyncIterator[Writer]:
    """A writer running on a pool of its own; on leaving, it writes what it holds (ten seconds at
    most) and stops."""
    async with _own_writer() as writer:
        stop = asyncio.Event()
        runner = asyncio.create_task(writer.run(stop))
        yield writer
        for _ in range(200):
            await asyncio.sleep(0.05)
            if not writer.pending():
                break
        stop.set()
        await runner


def test_a_row_postgresql_refuses_does_not_hold_back_the_others():
    good = TaskRunFactory(worker_id="w")
    bad = TaskRunFactory(worker_id="w")

    async def scenario():
        async with _running_writer() as writer:
            # A value that slipped past validation: PostgreSQL cannot cast it to jsonb.
            writer.result(Result(str(bad.id), "w", True, False, "{not json", None))
            writer.result(Result(str(good.id), "w", True, False, '{"ok": true}', None))

    asyncio.run(scenario())
    done = Task.objects.get(id=good.task_id)
    assert done.status == "COMPLETED" and done.output == {"ok": True}
    refused = Task.objects.get(id=bad.task_id)
    assert refused.status == "FAILED" and "could not be stored" in refused.error_message


def test_a_start_that_came_in_during_a_refused_pass_is_written_when_its_items_are_retried_one_by_one():
    """A start waits a pass for its result only in a normal pass. Once PostgreSQL refused a pass and
    its items are written one at a time, a start that came in during that pass is written then, not
    left for the normal pass after."""
    bad = TaskRunFactory(worker_id="w")
    task = TaskFactory(status="DISPATCHING", claimed_by="test-node")

    async def scenario() -> list:
        async with _own_writer() as writer:
            writer.result(Result(str(bad.id), "w", True, False, "{not json", None))
            with pytest.raises(psycopg.Error):
                await writer.flush_once()  # the refused pass
            writer.start(InFlight(task_id=str(task.id), run_id=str(uuid.uuid4()), queue=task.queue, attempt=1), "w")
            await writer._isolate()
            return writer._starts

    assert asyncio.run(scenario()) == []
    assert Task.objects.get(id=task.id).status == "RUNNING"
    assert Task.objects.get(id=bad.task_id).status == "FAILED"


@pytest.mark.parametrize("path", ["reaped while the dispatcher stalled", "claim lost, claimed elsewhere",
                                  "start refused"])
def test_an_assignment_whose_start_is_not_written_is_cancelled_and_its_result_ignored(path):
    """The assignment left before its start was written, and the start then fails: the task went back
    to PENDING (the reaper's DISPATCHING timeout during a stall), another node holds it (this node's
    claim was lost in a crash, as claims commit without waiting for the flush), or PostgreSQL refuses
    the start. The worker is told to stop, its result changes nothing, and the writer does not spin
    on a result that can never be written."""
    status, claimed_by, worker = {
        "reaped while the dispatcher stalled": ("PENDING", None, "w"),
        "claim lost, claimed elsewhere": ("DISPATCHING", "other-node", "w"),
        "start refused": ("DISPATCHING", "test-node", "w" * 300),  # longer than workers' ids may be
    }[path]
    task = TaskFactory(status=status, claimed_by=claimed_by)
    cancelled: list[str] = []

    async def scenario() -> tuple[bool, int]:
        pool = make_pool("writer-test", min_size=1, max_size=2, session=sql.WRITER_SESSION)
        await pool.open()
        writer = _writer(pool, cancel=lambda task_id, why: cancelled.append(task_id))
        passes = 0
        flush_once = writer.flush_once

        async def counted() -> None:
            nonlocal passes
            passes += 1
            await flush_once()

        writer.flush_once = counted
        stop = asyncio.Event()
        runner = asyncio.create_task(writer.run(stop))
        entry = InFlight(task_id=str(task.id), run_id=str(uuid.uuid4()), queue=task.queue, attempt=1)
        writer.start(entry, worker)
        writer.result(Result(entry.run_id, worker, True, False, '{"done": true}', entry))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if not writer.pending():
                break
        await asyncio.sleep(0.1)  # a pass under way when the last entry settled ends first
        still_pending, passes_then = writer.pending(), passes
        await asyncio.sleep(0.3)
        spun = passes - passes_then
        stop.set()
        try:
            await asyncio.wait_for(runner, 5)  # it ends once nothing is left to write
        except TimeoutError:
            still_pending = True
        await pool.close()
        return still_pending, spun

    still_pending, spun = asyncio.run(scenario())
    assert not still_pending and spun == 0  # everything settled, and no pass since
    assert cancelled == [str(task.id)]
    assert not TaskRun.objects.filter(task_id=task.id).exists()
    assert (Task.objects.get(id=task.id).status, Task.objects.get(id=task.id).claimed_by) == (status, claimed_by)


def test_a_sent_task_counts_as_starting_until_its_start_is_written():
    """What the sweep reads (Writer.starting) so as not to put back a task whose result came back
    before its start was written. A start with no result yet waits out one pass for it, and the
    next pass writes it."""
    task = TaskFactory(status="DISPATCHING", claimed_by="test-node")

    async def scenario() -> list[tuple[bool, str]]:
        seen = []
        async with _own_writer() as writer:
            entry = InFlight(task_id=str(task.id), run_id=str(uuid.uuid4()), queue=task.queue, attempt=1)
            writer.start(entry, "w")
            for _ in range(3):
                async with writer.pool.connection() as conn:
                    cur = await conn.execute("SELECT status FROM tasks WHERE id = %s", (task.id,))
                    status, = await cur.fetchone()
                seen.append((str(task.id) in writer.starting, status))
                await writer.flush_once()
        return seen

    assert asyncio.run(scenario()) == [(True, "DISPATCHING"), (True, "DISPATCHING"), (False, "RUNNING")]


def test_a_start_waits_one_pass_for_its_result_to_be_written_with_it():
    """Under load a result comes back a pass after its start reached the writer: the start waits
    that pass out, and the two are written as one change. A start whose result takes longer is
    written alone by the pass after."""
    no_event_watchers_left()
    quick, slow = (TaskFactory(status="DISPATCHING", claimed_by="test-node") for _ in range(2))

    async def scenario() -> None:
        async with _own_writer(max_size=1) as writer:
            entries = {t.id: InFlight(task_id=str(t.id), run_id=str(uuid.uuid4()), queue="q", attempt=1)
                       for t in (quick, slow)}
            for entry in entries.values():
                writer.start(entry, "w")
            await writer.flush_once()  # both wait
            writer.result(Result(entries[quick.id].run_id, "w", True, False, "{}", entries[quick.id]))
            await writer.flush_once()  # the quick one with its result, the slow one alone
            assert not writer.pending()

    before = _run_versions()
    asyncio.run(scenario())
    assert _run_versions() - before == 0  # no run row written twice
    assert (Task.objects.get(id=quick.id).status, TaskRun.objects.get(task_id=quick.id).status) == (
        "COMPLETED", "COMPLETED")
    assert (Task.objects.get(id=slow.id).status, TaskRun.objects.get(task_id=slow.id).status) == (
        "RUNNING", "RUNNING")


def test_a_result_that_comes_before_its_start_waits_for_it_without_holding_up_the_loop():
    """A worker may answer before its stream handler has handed the start to the writer (the
    write's completion is reported later). The writer waits for the start, letting the handler
    run meanwhile, and then writes both."""
    task = TaskFactory(status="DISPATCHING", claimed_by="test-node")
    outcome: list[str] = []

    async def scenario() -> None:
        async with _running_writer() as writer:
            entry = InFlight(task_id=str(task.id), run_id=str(uuid.uuid4()), queue=task.queue, attempt=1)
            writer.result(Result(entry.run_id, "w", True, False, '{"ok": true}', entry))
            await asyncio.sleep(0.05)  # the handler's turn comes while the writer waits
            writer.start(entry, "w")
        outcome.append("done")

    # In a thread of its own: a writer that never yields would hold this one forever.
    thread = threading.Thread(target=asyncio.run, args=(scenario(),), daemon=True)
    thread.start()
    thread.join(20)
    assert outcome == ["done"], "the writer held up the event loop"
    assert Task.objects.get(id=task.id).status == "COMPLETED"
    assert TaskRun.objects.get(task_id=task.id).status == "COMPLETED"


def test_unsent_tasks_are_put_back_even_when_the_first_try_fails():
    """Another transaction holds the task's row past the writer's lock timeout: the first UNSEND
    fails, and a later try puts the task back, without waiting for the scheduler's reaper."""
    task = TaskFactory(status="DISPATCHING", claimed_by="test-node")

    async def scenario() -> None:
        pool = make_pool("writer-test", min_size=1, max_size=2, session="SET lock_timeout = '50ms'")
        await pool.open()
        try:
            writer = _writer(pool)
            async with await psycopg.AsyncConnection.connect(database_url()) as holder:
                await holder.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (task.id,))
                writer.unsend([str(task.id)])
                await asyncio.sleep(0.3)  # the first tries time out on the lock
                await holder.rollback()
                for _ in range(100):
                    await asyncio.sleep(0.05)
                    cur = await holder.execute("SELECT status FROM tasks WHERE id = %s", (task.id,))
                    if (await cur.fetchone()) == ("PENDING",):
                        break
                await holder.rollback()
        finally:
            await pool.close()

    asyncio.run(scenario())
    assert Task.objects.get(id=task.id).status == "PENDING"


def _one_pass(items: list[tuple[str, bool | None]]) -> None:
    """One writer pass holding a start for each task id, and its result where given (True: done,
    False: failed for good), then the pass that writes the starts left waiting for a result; the
    writer's connections closed after them."""
    async def scenario() -> None:
        async with _own_writer(max_size=1) as writer:
            for task_id, outcome in items:
                entry = InFlight(task_id=task_id, run_id=str(uuid.uuid4()), queue="q", attempt=1)
                writer.start(entry, "w")
                if outcome is not None:
                    writer.result(Result(entry.run_id, "w", outcome, False,
                                         json.dumps({"task": task_id}) if outcome else "boom", entry))
            await writer.flush_once()
            await writer.flush_once()
            assert not writer.pending()

    asyncio.run(scenario())


def _run_versions() -> int:
    """Updates of task_runs rows reported so far. A backend reports its counts when it ends (or
    idles, at most once a second); the writer's have ended once its pool is closed."""
    with connection.cursor() as cur:
        deadline = time.monotonic() + 10
        while True:  # the writer's backends report as they exit, a moment after the pool closed
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'writer-test'"
                        " AND datname = current_database()")
            if cur.fetchone()[0] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        cur.execute("SELECT pg_stat_force_next_flush()")  # this backend's own counts, at once
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'task_runs'")
        return cur.fetchone()[0]


def test_a_start_and_its_result_in_one_pass_are_written_as_one_change():
    """Under load most results reach the writer in the pass their start waits for. The task then
    moves DISPATCHING → COMPLETED and its run row is written COMPLETED, with no RUNNING version
    of either in between; what is written is what the start and the result would write one after
    the other. A task with a signal waiting is started first, so that the signal is handed over
    as it would be; a failed result, and a start with no result yet, are written as before."""
    no_event_watchers_left()
    done, signalled, failed, started = (TaskFactory(status="DISPATCHING", claimed_by="test-node") for _ in range(4))
    SignalFactory(task=signalled)
    before = _run_versions()
    _one_pass([(str(done.id), True), (str(signalled.id), True), (str(failed.id), False), (str(started.id), None)])
    after = _run_versions()

    for task in (done, signalled):
        task.refresh_from_db()
        run = TaskRun.objects.get(task_id=task.id)
        assert (task.status, task.attempt_count, task.output) == ("COMPLETED", 1, {"task": str(task.id)})
        assert (run.status, run.attempt_number, run.worker_id, run.output) == ("COMPLETED", 1, "w", task.output)
        assert task.started_at == run.started_at == task.finished_at == run.finished_at
    assert Task.objects.get(id=failed.id).status == "FAILED"
    assert TaskRun.objects.get(task_id=failed.id).status == "FAILED"
    assert Task.objects.get(id=started.id).status == "RUNNING"
    assert TaskRun.objects.get(task_id=started.id).status == "RUNNING"
    # The run rows written RUNNING and then closed: the failed task's, and the signalled one's, whose
    # start took its signal (here, with no session holding the task, put back for the next attempt).
    assert after - before == 2


def test_while_task_events_are_watched_a_start_and_its_result_are_announced_apart():
    """Task events show each change: the start (DISPATCHING → RUNNING) and the end (RUNNING →
    COMPLETED), even when the writer has both in one pass."""
    task = TaskFactory(status="DISPATCHING", claimed_by="test-node")
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute("LISTEN valka_task_event")
        listener.execute("SELECT valka_task_events_watch()")
        _one_pass([(str(task.id), True)])
        events = [e for note in listener.notifies(timeout=2, stop_after=None) for e in json.loads(note.payload)]
    assert [(e["previous_status"], e["new_status"]) for e in events if e["task_id"] == str(task.id)] == [
        ("DISPATCHING", "RUNNING"), ("RUNNING", "COMPLETED")]
    assert Task.objects.get(id=task.id).status == "COMPLETED"
