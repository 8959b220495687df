"""A cancel of a running sync handler, in a process of its own: `python -m tests.sdk.interrupt_scenario
true|false` prints, as JSON, the run's result, how the handler ended, and what the worker asked of
PyThreadState_SetAsyncExc (tests/sdk/test_worker.py runs it).

Apart, so that nothing an earlier test left in the process runs in the handler's thread. And the
handler is watched from outside its frame: on this Python (3.13.0) an asynchronous exception that
lands at a loop's back edge can leave the frame past the frame's own `except` clause (seen: a
TaskCancelled raised on a `while` line inside a `try` that caught TaskCancelled, and not caught)."""

from __future__ import annotations

import asyncio
import ctypes
import json
import sys
import threading
import time

from tests.sdk.test_worker import Runs
from valka_sdk import Worker


def scenario(interrupt: bool) -> dict:
    worker = Worker(queues=["q"], interrupt_sync_handlers=interrupt)
    ended: list[dict] = []  # how the handler left: its exception (or none) and after how long
    running = threading.Event()
    raised: list[tuple[int, str | None, int]] = []
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc

    def recorded(thread, exc):
        answer = set_async_exc(thread, exc)
        raised.append((thread.value, exc.value.__name__ if exc is not None else None, answer))
        return answer

    ctypes.pythonapi.PyThreadState_SetAsyncExc = recorded

    def busy(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        running.set()
        while time.monotonic() < deadline:
            sum(range(100))

    @worker.task("spin")
    def spin(ctx):
        began = time.monotonic()
        try:
            busy(30 if interrupt else 1.0)  # interrupted long before its end
        except BaseException as exc:
            ended.append({"exception": type(exc).__name__, "thread": threading.get_ident(),
                          "seconds": time.monotonic() - began})
            raise
        ended.append({"exception": None, "thread": threading.get_ident(), "seconds": time.monotonic() - began})

    async def run():
        async with Runs(worker) as runs:
            runs.start("spin")
            assert await asyncio.to_thread(running.wait, 10)
            worker._cancel("t1", "by a test")
            result = await runs.result()
            for _ in range(200):  # the handler's thread ends: at once when interrupted, else after 1 s
                if ended:
                    break
                await asyncio.sleep(0.05)
            return result

    result = asyncio.run(run())
    return {"success": result.success, "error_message": result.error_message, "ended": ended, "raised": raised}


if __name__ == "__main__":
    print(json.dumps(scenario(sys.argv[1] == "true")))
