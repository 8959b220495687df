"""What one message may carry: an output or a log too big for the stream costs its run, not the
worker's session with every task on it."""

from __future__ import annotations

from tasks import services
from tasks.models import Task, TaskLog, TaskRun, Worker
from tests.helpers import MiB, wait_for, wait_status


def test_a_huge_output_fails_its_run_and_a_huge_log_is_cut_while_the_session_stays_up(stack):
    _, addr = stack.dispatcher()
    stack.worker(addr, queues="big", concurrency=4, name="big")
    worker = wait_for(lambda: Worker.objects.filter(name="big", status="CONNECTED").first(), what="the worker")
    huge = services.task_enqueue(task_name="big_output", queue="big", input={"bytes": 17 * MiB}, max_retries=0)
    chatty = services.task_enqueue(task_name="many_logs", queue="big", input={"lines": 500, "bytes": 40_000})
    others = [services.task_enqueue(task_name="echo", queue="big", input={"i": i}) for i in range(6)]

    failed = wait_status(huge.id, "FAILED", "COMPLETED", "DEAD_LETTER", "RETRY", timeout=90)
    assert failed.status == "FAILED"
    assert failed.error_message == f"output too large: {17 * MiB + 2} bytes, limit {15 * MiB}"
    assert wait_status(chatty.id, "COMPLETED", "FAILED", "RETRY", timeout=90).status == "COMPLETED"
    for task in others:
        assert wait_status(task.id, "COMPLETED", "FAILED", "RETRY").status == "COMPLETED"
    # The log was cut at 10 MiB a run, with one line saying how much was dropped.
    run = TaskRun.objects.get(task_id=chatty.id)
    lines = list(TaskLog.objects.filter(run_id=run.id).order_by("id"))
    kept = [line for line in lines if not line.message.startswith("log truncated")]
    truncated = [line for line in lines if line.message.startswith("log truncated")]
    assert 200 < len(kept) < 500 and sum(len(line.message) for line in kept) <= 10 * MiB
    assert [line.message for line in kept] == [f"{i:06d} " + "y" * 40_000 for i in range(len(kept))]
    assert len(truncated) == 1 and truncated[0].level == "WARN"
    assert truncated[0].metadata["dropped_lines"] == 500 - len(kept)
    # One session throughout: nothing was lost, nothing reconnected.
    assert TaskRun.objects.filter(task__queue="big", status="LOST").count() == 0
    assert Worker.objects.get(id=worker.id).session_id == worker.session_id
    assert Task.objects.filter(queue="big", attempt_count__gt=1).count() == 0
