"""Two worker processes given one worker id: the second is refused while the first is connected,
and gets in once the first is gone."""

from __future__ import annotations

import os
import signal

from tasks import services
from tasks.models import TaskRun, Worker
from tests.helpers import wait_for, wait_status


def test_a_second_process_with_a_worker_id_in_use_is_refused_until_the_first_is_gone(stack, tmp_path):
    _, addr = stack.dispatcher()
    first = stack.worker(addr, queues="twins", name="first", VALKA_TEST_WORKER_ID="twin")
    holder = wait_for(lambda: Worker.objects.filter(id="twin", status="CONNECTED").first(), what="the first")
    task = services.task_enqueue(task_name="sleep", queue="twins", input={"seconds": 4, "mark": str(tmp_path)})
    wait_status(task.id, "RUNNING")

    second = stack.worker(addr, queues="twins", name="second", VALKA_TEST_WORKER_ID="twin",
                          VALKA_TEST_RECONNECT_MAX="1")
    wait_for(lambda: "ALREADY_EXISTS" in second.log_path.read_text() or "held by another" in
             second.log_path.read_text(), what="the second refused")
    # The first keeps its session and its run: nothing of it was closed.
    assert wait_status(task.id, "COMPLETED", "RETRY", "FAILED").status == "COMPLETED"
    assert list(TaskRun.objects.filter(task_id=task.id).values_list("status", flat=True)) == ["COMPLETED"]
    assert Worker.objects.get(id="twin").session_id == holder.session_id
    assert "held by another" in second.log_path.read_text()

    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    wait_for(lambda: Worker.objects.filter(id="twin", status="CONNECTED").exclude(
        session_id=holder.session_id).exists(), timeout=20, what="the second let in")
    again = services.task_enqueue(task_name="echo", queue="twins", input={"after": "takeover"})
    assert wait_status(again.id, "COMPLETED").output["worker"] == "second"


def test_the_same_holds_across_dispatchers(stack, tmp_path):
    _, one = stack.dispatcher()
    _, two = stack.dispatcher()
    stack.worker(one, queues="twins", name="first", VALKA_TEST_WORKER_ID="twin")
    holder = wait_for(lambda: Worker.objects.filter(id="twin", status="CONNECTED").first(), what="the first")
    second = stack.worker(two, queues="twins", name="second", VALKA_TEST_WORKER_ID="twin")
    wait_for(lambda: "held by another" in second.log_path.read_text(), what="the second refused")
    task = services.task_enqueue(task_name="echo", queue="twins", input={"after": "refusal"})
    assert wait_status(task.id, "COMPLETED").output["worker"] == "first"
    assert Worker.objects.get(id="twin").session_id == holder.session_id
