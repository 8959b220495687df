"""A long task that talks back: `python examples/progress_worker.py` (make run starts one).

`long_report` works through 600 steps of 0.5 s. When it receives a
`progress_request` signal it logs how far it is; on a `shutdown` signal it
stops cleanly and returns what it has so far.
"""

import asyncio
import logging
import os

from valka_sdk import Worker

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

worker = Worker(
    os.environ.get("VALKA_WORKER_SERVER", "127.0.0.1:50051"),
    queues=["long"],
    concurrency=4,
    name="progress-worker",
    token=os.environ.get("VALKA_WORKER_TOKEN") or None,
)


@worker.task("long_report")
async def long_report(ctx):
    steps = int((ctx.input or {}).get("steps", 600))
    done = 0
    signals = ctx.signals()
    next_signal = asyncio.ensure_future(anext(signals))
    try:
        while done < steps:
            step = asyncio.ensure_future(asyncio.sleep(0.5))
            finished, _ = await asyncio.wait({step, next_signal}, return_when=asyncio.FIRST_COMPLETED)
            if next_signal in finished:
                signal = next_signal.result()
                if signal.type == "progress_request":
                    ctx.log("progress", done=done, steps=steps, percent=round(100 * done / steps, 1))
                elif signal.type == "shutdown":
                    ctx.warn("shutting down on request", done=done, reason=(signal.payload or {}).get("reason"))
                    step.cancel()
                    return {"completed_steps": done, "stopped_early": True}
                next_signal = asyncio.ensure_future(anext(signals))
            if step in finished:
                done += 1
        return {"completed_steps": done, "stopped_early": False}
    finally:
        next_signal.cancel()


if __name__ == "__main__":
    worker.run()
