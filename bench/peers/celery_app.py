"""The Celery app the benchmark runs: a no-op task and one that returns when it started.

Results go to Redis (database 1), Celery's usual result backend: that is where the
benchmark reads when each task finished, as it reads Valka's from PostgreSQL.
"""

import os
import time

from celery import Celery

REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379")

app = Celery("bench", broker=f"{REDIS}/0", backend=f"{REDIS}/1")
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                task_serializer="json", result_serializer="json", accept_content=["json"])


@app.task(name="noop")
def noop(**kwargs):
    return None


@app.task(name="stamp")
def stamp():
    return time.time()
