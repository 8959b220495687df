"""A cancel of a running sync handler, in a process of its own: `python -m tests.sdk.interrupt_scenario
true|false` prints, as JSON, the run's result, what the handler saw, and what the worker asked of
PyThreadState_SetAsyncExc (tests/sdk/test_worker.py runs it).

Apart, because in a long test process the interruption was delivered (answered 1) and yet never
raised in the handler in some full runs: what earlier tests leave in a process (finalizers, hooks)
can take an asynchronous exception in the handler's thread before the handler sees it."""

from __future__ import annotations

import asyncio
import ctypes
import json
import sys
import threading
import time

from tests.sdk.test_worker import Runs
from valka_sdk import Worker
from valka_sdk.errors import TaskCancelled


def scenario(interrupt: bool) -> dict:
    worker = Worker(queues=["q"], interrupt_sync_handlers=interrupt)
    seen: list[str] = []
    running = threading.Event()
    raised: list[tuple[int, str | None, int]] = []
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc

    def recorded(thread, exc):
        answer = set_async_exc(thread, exc)
        raised.append((thread.value, exc.value.__name__ if exc is not None else None, answer))
        return answer

    ctypes.pythonapi.PyThreadState_SetAsyncExc = recorded

    @worker.task("spin")
    def spin(ctx):
        deadline = time.monotonic() + (30 if interrupt else 1.0)  # interrupted long before its end
        try:
            running.set()  # inside the try: the interruption may land as soon as the test hears it
            while time.monotonic() < deadline:
                sum(range(100))
        except TaskCancelled:
            seen.append(f"interrupted in {threading.get_ident()}")
            raise
        seen.append("ran to the end")

    async def run():
        async with Runs(worker) as runs:
            runs.start("spin")
            assert await asyncio.to_thread(running.wait, 10)
            worker._cancel("t1", "by a test")
            result = await runs.result()
            for _ in range(200):  # the handler's thread ends: at once when interrupted, else after 1 s
                if seen:
                    break
                await asyncio.sleep(0.05)
            return result

    result = asyncio.run(run())
    return {"success": result.success, "error_message": result.error_message, "seen": seen, "raised": raised}


if __name__ == "__main__":
    print(json.dumps(scenario(sys.argv[1] == "true")))
