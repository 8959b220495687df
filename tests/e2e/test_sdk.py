"""The Python SDK from the outside: the REST client (sync and async) and a worker's graceful stop."""

from __future__ import annotations

import asyncio
import signal

import pytest

from tasks import services
from tasks.models import Task, Worker
from tests.helpers import wait_for, wait_status
from valka_sdk import AsyncClient, Client, ValkaAPIError


def test_sync_client(stack):
    web = stack.web()
    with Client(web) as client:
        task = client.create_task("echo", queue="sdk", input={"a": 1}, priority=2, idempotency_key="sdk-1",
                                  metadata={"m": True}, max_retries=1, timeout_seconds=30)
        assert task["status"] == "PENDING" and task["priority"] == 2
        assert client.create_task("echo", queue="sdk", idempotency_key="sdk-1")["id"] == task["id"]
        assert client.get_task(task["id"])["input"] == {"a": 1}
        page = client.list_tasks(queue="sdk", status="PENDING")
        assert page["count"] == 1 and page["results"][0]["id"] == task["id"]
        assert client.cancel_task(task["id"])["status"] == "CANCELLED"
        with pytest.raises(ValkaAPIError) as err:
            client.cancel_task(task["id"])
        assert err.value.status == 409 and err.value.code == "INVALID_STATE"
        with pytest.raises(ValkaAPIError) as err:
            client.create_task("echo", queue="bad queue")
        assert err.value.code == "VALIDATION_ERROR" and "queue" in err.value.details


def test_async_client_and_a_worker_that_runs_it(stack):
    web = stack.web()
    _, addr = stack.dispatcher()
    stack.worker(addr, queues="sdk-async")

    async def scenario():
        async with AsyncClient(web) as client:
            task = await client.create_task("echo", queue="sdk-async", input=[1, 2, 3])
            for _ in range(400):
                current = await client.get_task(task["id"])
                if current["status"] == "COMPLETED":
                    return current
                await asyncio.sleep(0.05)
            raise AssertionError("not completed")

    done = asyncio.run(scenario())
    assert done["output"]["echo"] == [1, 2, 3]


def test_sigterm_drains_running_handlers_then_exits(stack):
    dispatcher, addr = stack.dispatcher()
    worker = stack.worker(addr, name="drainer", VALKA_TEST_DRAIN="20")
    task = services.task_enqueue(task_name="sleep", queue="default", input={"seconds": 2})
    wait_status(task.id, "RUNNING")
    worker.send_signal(signal.SIGTERM)
    # Until the worker's shutdown message reaches the dispatcher, a task may still be assigned
    # to it, and the worker runs what it was assigned; from then on it gets nothing new.
    wait_for(lambda: "is draining" in dispatcher.log_path.read_text(), what="the dispatcher sees the drain")
    later = services.task_enqueue(task_name="echo", queue="default")
    # The running task finishes; the draining worker takes no new work; then it exits cleanly.
    assert wait_status(task.id, "COMPLETED").attempt_count == 1
    assert worker.wait(30) == 0
    assert Task.objects.get(id=later.id).status == "PENDING"
    wait_for(lambda: Worker.objects.filter(name="drainer", status="DISCONNECTED").exists(), what="disconnected")
