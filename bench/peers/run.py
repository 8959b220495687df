"""`python -m bench.peers.run celery|procrastinate|django-tasks-db [options]`: one peer's figures, as JSON on stdout.

`celery-enqueue` runs Celery's single-caller enqueue alone, for a round in turns with Valka's.

Started by `bench.run` with `.venv-peers/bin/python`; progress bars go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.interrupt import stop_on_sigterm


def main(argv: list[str] | None = None) -> int:
    stop_on_sigterm()
    parser = argparse.ArgumentParser(prog="python -m bench.peers.run")
    parser.add_argument("peer", choices=["celery", "procrastinate", "django-tasks-db", "celery-enqueue"])
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--enqueue-count", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--latency-count", type=int, default=1000)
    parser.add_argument("--latency-rate", type=float, default=20.0)
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--procrastinate-url", default="")
    parser.add_argument("--django-tasks-db-url", default="")
    parser.add_argument("--celery-concurrency", type=int, default=2)
    parser.add_argument("--procrastinate-concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    if args.peer == "celery-enqueue":
        from bench.peers.celery_bench import enqueue

        print(json.dumps(enqueue(args.redis_url, args.enqueue_count)))
        return 0
    with tempfile.TemporaryDirectory(prefix=f"valka-bench-{args.peer}-") as tmp:
        if args.peer == "celery":
            from bench.peers import celery_bench as bench
        elif args.peer == "procrastinate":
            from bench.peers import procrastinate_bench as bench  # type: ignore[no-redef]
        else:
            from bench.peers import django_tasks_db_bench as bench  # type: ignore[no-redef]
        figures = bench.run(args, Path(tmp))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
