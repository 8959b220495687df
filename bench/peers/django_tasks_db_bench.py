"""django-tasks-db: the workloads of `bench.django_tasks`, through Django's task API the same way.

Its own database on the benchmark's PostgreSQL. `Task.enqueue()` in a loop (one row and one
commit each); then each drain round enqueues N no-op tasks in one transaction (the backend has no
batch enqueue) while one `manage.py db_worker` process (`--interval 0.1`: it polls) takes them,
and counts from the commit to the last `finished_at`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.measure import bar, rounds_summary, stop, wait_until_done


def run(args: Any, workdir: Path) -> dict[str, Any]:
    os.environ.update(DJANGO_SETTINGS_MODULE="bench.peers.django_tasks_db_project",
                      BENCH_DTDB_URL=args.django_tasks_db_url)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import transaction
    from django.db.models import Max
    from django_tasks_db.models import DBTaskResult

    from bench.peers.django_tasks_db_jobs import noop

    call_command("migrate", verbosity=0)
    out: dict[str, Any] = {"worker": "db_worker --interval 0.1"}
    task = noop.using(queue_name="enqueue")
    with bar(args.enqueue_count, "django-tasks-db enqueue x1") as progress:
        start = time.perf_counter()
        for _ in range(args.enqueue_count):
            task.enqueue()
            progress.update(1)
        seconds = time.perf_counter() - start
    out["django_enqueue"] = {"rate_per_s": args.enqueue_count / seconds, "count": args.enqueue_count}
    DBTaskResult.objects.all().delete()

    log = open(workdir / "django-tasks-db-worker.log", "ab")  # noqa: SIM115 (closed below)
    worker = subprocess.Popen([sys.executable, "-m", "django", "db_worker", "--queue-name", "django-drain",
                               "--interval", "0.1", "--no-startup-delay", "--no-reload"],
                              env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        time.sleep(2)  # its start-up; it polls, so nothing is missed meanwhile
        if worker.poll() is not None:
            raise RuntimeError("the django-tasks-db worker exited")

        def succeeded() -> int:
            return DBTaskResult.objects.filter(status="SUCCESSFUL").count()

        rates = []
        for r in range(args.rounds):
            DBTaskResult.objects.all().delete()
            with transaction.atomic():
                for _ in range(args.n):
                    noop.enqueue()
            t0 = time.time()
            wait_until_done(succeeded, args.n, f"django-tasks-db drain {r + 1}/{args.rounds}", max(120.0, args.n / 5))
            last = DBTaskResult.objects.aggregate(last=Max("finished_at"))["last"]
            rates.append(args.n / max(last.timestamp() - t0, 1e-6))
        out["django_drain"] = rounds_summary(rates, n=args.n)
    finally:
        stop(worker)
        log.close()
    return out
