"""The failure story of the product docs, on the real statements: a handler that keeps
failing is retried after 1 s, 2 s and 4 s (within the jitter), then lands in DEAD_LETTER
with its dead-letter row; replaying it creates a new task that runs.

The dispatcher's side is played with its own statements (claim, start, retry, complete);
the scheduler's side is the retry engine. Time moves through `now`, not sleeps."""

import asyncio
import uuid

import pytest

from dispatcher import sql as dispatcher_sql
from tasks import services
from tasks.models import DeadLetter, Task, TaskRun
from tasks.scheduler.retry import RetryEngine
from tasks.sql import outcomes
from tests.helpers import connect, make_config, run_async

pytestmark = pytest.mark.django_db(transaction=True)

NODE = "node-story"
WORKER = "worker-story"


async def claim_and_start(conn, queue: str) -> tuple[uuid.UUID, int, uuid.UUID]:
    cur = await conn.execute(dispatcher_sql.CLAIM, dispatcher_sql.claim_params(queue=queue, limit=10, node_id=NODE))
    rows = await cur.fetchall()
    assert len(rows) == 1, rows
    task_id, attempt = uuid.UUID(rows[0][0]), rows[0][5]  # the claim returns ids as text
    run_id = uuid.uuid4()
    await conn.execute(dispatcher_sql.START_RUNS, {"task_ids": [task_id], "run_ids": [run_id],
                                                   "worker_ids": [WORKER], "node_id": NODE})
    return task_id, attempt, run_id


async def task_row(conn, task_id):
    cur = await conn.execute("SELECT status, attempt_count, run_at, updated_at FROM tasks WHERE id = %s", [task_id])
    return await cur.fetchone()


def test_retries_back_off_then_dead_letter_then_replay_runs():
    task = services.task_enqueue(task_name="flaky", queue="story", max_retries=3)
    config = make_config()
    engine = RetryEngine(config)

    async def fail_until_dead() -> list[float]:
        delays = []
        async with await connect() as conn:
            for expected_attempt in (1, 2, 3, 4):
                task_id, attempt, run_id = await claim_and_start(conn, "story")
                assert (task_id, attempt) == (task.id, expected_attempt)
                await outcomes.retry_runs(conn, [run_id], [WORKER], ["RuntimeError: boom"], lost=False,
                                          retry_params=config.retry_params)
                status, attempts, run_at, updated_at = await task_row(conn, task.id)
                assert attempts == expected_attempt
                if expected_attempt == 4:
                    assert status == "DEAD_LETTER"
                    break
                assert status == "RETRY"
                delays.append((run_at - updated_at).total_seconds())
                # Not a moment early; then on time.
                assert await engine.run_once(conn, now=run_at - (run_at - updated_at) / 2) == 0
                assert await engine.run_once(conn, now=run_at) == 1
                assert (await task_row(conn, task.id))[0] == "PENDING"
                # The backoff has passed for the dispatcher too (its claim reads the real clock).
                await conn.execute("UPDATE tasks SET run_at = now() WHERE id = %s", [task.id])
        return delays

    delays = run_async(fail_until_dead)
    for delay, nominal in zip(delays, (1.0, 2.0, 4.0), strict=True):
        assert nominal * 0.75 <= delay <= nominal * 1.25, delays

    dead = Task.objects.get(id=task.id)
    assert dead.status == "DEAD_LETTER" and dead.attempt_count == 4 and dead.error_message == "RuntimeError: boom"
    assert list(TaskRun.objects.filter(task_id=task.id).order_by("attempt_number")
                .values_list("attempt_number", "status")) == [(n, "FAILED") for n in (1, 2, 3, 4)]
    letter = DeadLetter.objects.get(task_id=task.id)
    assert letter.attempt_count == 4 and letter.error_message == "RuntimeError: boom"

    replay = services.dead_letter_replay(dead_letter_id=letter.id)
    assert replay.id != task.id and replay.status == "PENDING" and replay.attempt_count == 0

    async def run_replay() -> None:
        async with await connect() as conn:
            task_id, attempt, run_id = await claim_and_start(conn, "story")
            assert (task_id, attempt) == (replay.id, 1)
            await outcomes.complete_runs(conn, [run_id], [WORKER], ['{"ok": true}'])

    asyncio.run(run_replay())
    done = Task.objects.get(id=replay.id)
    assert done.status == "COMPLETED" and done.output == {"ok": True}
    assert DeadLetter.objects.get(id=letter.id).replay_task_id == replay.id
