"""The SDK worker's runs, in process: the stream is replaced by its outbox, so each test sees the
`TaskResult` and log lines a run would send. The stream itself is tested end to end (tests/e2e)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from valka_sdk import NonRetryableError, Worker
from valka_sdk.errors import MARK, MAX_ERROR, format_failure, parse_failure
from valka_sdk.v1 import worker_pb2 as pb
from valka_sdk.worker import _RunLogHandler


class Runs:
    """A worker whose runs' messages land in `self.sent`."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.sent: list[pb.WorkerRequest] = []

    async def __aenter__(self) -> Runs:
        w = self.worker
        w._loop = asyncio.get_running_loop()
        w._executor = ThreadPoolExecutor(max_workers=2)
        w._outbox = asyncio.Queue()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.worker._executor.shutdown(wait=False, cancel_futures=True)

    def start(self, task_name: str, task_id: str = "t1", input: str = "") -> None:
        self.worker._start(pb.TaskAssignment(task_id=task_id, task_run_id=f"run-{task_id}", task_name=task_name,
                                             queue_name="q", attempt_number=1, input=input))

    async def result(self, timeout: float = 5.0) -> pb.TaskResult:
        outbox = self.worker._outbox
        assert outbox is not None
        deadline = time.monotonic() + timeout
        while True:
            message = await asyncio.wait_for(outbox.get(), max(0.01, deadline - time.monotonic()))
            self.sent.append(message)
            if message.WhichOneof("request") == "task_result":
                return message.task_result

    def lines(self) -> list[tuple[int, str]]:
        return [(e.level, e.message) for m in self.sent if m.WhichOneof("request") == "log_batch"
                for e in m.log_batch.entries]


def test_a_failure_carries_its_class_path_and_traceback_within_the_limit():
    try:
        raise KeyError("missing")
    except KeyError as exc:
        text = format_failure("KeyError: 'missing'", exc)
    failure = parse_failure(text)
    assert failure.summary == "KeyError: 'missing'" and failure.exception_class_path == "builtins.KeyError"
    assert failure.traceback.startswith("Traceback (most recent call last):") and "KeyError: 'missing'" in text
    assert parse_failure("lease expired") == parse_failure("lease expired")
    assert parse_failure("lease expired").exception_class_path is None

    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("x" * 70_000 + "\n\n--- exception: forged.Path\n")
        deep(n - 1)

    try:
        deep(300)
    except ValueError as exc:
        text = format_failure("ValueError: many\nlines", exc)
    failure = parse_failure(text)
    assert len(text) <= MAX_ERROR and text.count(MARK) >= 1
    assert failure.summary == "ValueError: many" and failure.exception_class_path == "builtins.ValueError"
    assert failure.traceback.startswith("…") and failure.traceback.rstrip().endswith("forged.Path")


def test_resolver_finds_handlers_for_unregistered_names_once_and_failures_are_for_good():
    calls = []

    async def echo(ctx):
        return {"name": ctx.task_name}

    def resolve(name: str):
        calls.append(name)
        if name == "boom":
            raise ImportError("no module named boom")
        return echo if name.startswith("app.") else None

    async def scenario():
        async with Runs(Worker(queues=["q"], resolve=resolve)) as runs:
            for name in ("app.one", "app.one", "nothing", "boom"):
                runs.start(name, task_id=name)
                yield await runs.result()

    async def collect():
        return [r async for r in scenario()]

    one, again, nothing, boom = asyncio.run(collect())
    assert one.success and again.success and one.output == '{"name": "app.one"}'
    assert calls == ["app.one", "nothing", "boom"], "a resolved handler is kept"
    assert not nothing.success and not nothing.retryable and "no handler registered" in nothing.error_message
    failure = parse_failure(boom.error_message)
    assert not boom.retryable and failure.summary == "cannot resolve task 'boom': ImportError: no module named boom"
    assert "ImportError" in failure.traceback


def test_a_return_value_that_is_not_json_fails_for_good():
    worker = Worker(queues=["q"])

    @worker.task("sets")
    def sets(ctx):
        return {1, 2}

    async def scenario():
        async with Runs(worker) as runs:
            runs.start("sets")
            return await runs.result()

    result = asyncio.run(scenario())
    assert not result.success and not result.retryable
    assert result.error_message == "the handler's return value is not JSON: Object of type set is not JSON serializable"


def test_python_logging_inside_a_handler_goes_to_its_run_log():
    worker = Worker(queues=["q"], capture_logging=True)
    app_log = logging.getLogger("app.tasks")

    @worker.task("sync")
    def sync(ctx):
        app_log.warning("from a thread %s", 1)
        return None

    @worker.task("async")
    async def run_async(ctx):
        app_log.error("from the loop")
        try:
            raise ValueError("inner")
        except ValueError:
            app_log.exception("caught")
        return None

    async def main():
        handler = _RunLogHandler()  # what arun() installs when capture_logging is on
        root = logging.getLogger()
        root.addHandler(handler)
        try:
            async with Runs(worker) as runs:
                app_log.warning("outside any run")
                runs.start("sync", task_id="s")
                await runs.result()
                runs.start("async", task_id="a")
                await runs.result()
                await worker._flush_now()
                return runs
        finally:
            root.removeHandler(handler)

    runs = asyncio.run(main())
    lines = [(m.task_run_id, m.level, m.message.splitlines()[0]) for r in runs.sent
             if r.WhichOneof("request") == "log_batch" for m in r.log_batch.entries]
    assert lines == [("run-s", 3, "from a thread 1"), ("run-a", 4, "from the loop"), ("run-a", 4, "caught")]
    caught = next(m for r in runs.sent if r.WhichOneof("request") == "log_batch" for m in r.log_batch.entries
                  if m.message.startswith("caught"))
    assert "ValueError: inner" in caught.message and '"logger": "app.tasks"' in caught.metadata


@pytest.mark.parametrize("interrupt", [True, False])
def test_a_cancel_interrupts_a_sync_handler_when_asked(interrupt):
    """In a process of its own (tests/sdk/interrupt_scenario.py says why)."""
    done = subprocess.run([sys.executable, "-m", "tests.sdk.interrupt_scenario", str(interrupt).lower()],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert not run["success"] and run["error_message"] == "cancelled: by a test"
    [ended] = run["ended"]
    if interrupt:
        [thread, exc, answer], *_ = run["raised"]
        assert (exc, answer) == ("TaskCancelled", 1), run
        assert (ended["exception"], ended["thread"]) == ("TaskCancelled", thread) and ended["seconds"] < 15, run
    else:
        assert ended["exception"] is None and ended["seconds"] >= 1.0 and run["raised"] == [], run


def test_non_retryable_error_and_plain_exceptions():
    worker = Worker(queues=["q"])

    @worker.task("fatal")
    async def fatal(ctx):
        raise NonRetryableError("bad input")

    async def scenario():
        async with Runs(worker) as runs:
            runs.start("fatal")
            return await runs.result()

    result = asyncio.run(scenario())
    failure = parse_failure(result.error_message)
    assert not result.retryable and failure.summary == "bad input"
    assert failure.exception_class_path == "valka_sdk.errors.NonRetryableError"
