"""The Procrastinate app the benchmark runs: a no-op task and one that records when it started.

Procrastinate keeps no return values, so `stamp` appends "<job id> <start time>" to the
file named by BENCH_STAMPS.
"""

import os
import time

from procrastinate import App, JobContext, PsycopgConnector

app = App(connector=PsycopgConnector(conninfo=os.environ.get("BENCH_PROCRASTINATE_URL", "")))


@app.task(name="noop")
async def noop(**kwargs):
    return None


@app.task(name="stamp", pass_context=True)
async def stamp(context: JobContext):
    started = time.time()
    with open(os.environ["BENCH_STAMPS"], "a") as f:
        f.write(f"{context.job.id} {started}\n")
