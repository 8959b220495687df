"""`make bench`: Valka's throughput, latency and memory, measured on a stack of its own.

    python -m bench                 # Valka alone (make bench)
    python -m bench --peers         # and Celery+Redis and Procrastinate beside it (make bench-peers)

`bench.run` drives the run; `bench.stack` starts PostgreSQL and the processes;
`bench.enqueue`, `bench.drain` (drain and latency), `bench.scale` and
`bench.memory` are the workloads; `bench.report` prints the table and writes
`bench/results/`. `bench.peers` runs the same workloads on the peers, inside
their own virtualenv: it imports neither Django nor Valka, and neither may
this package's `__init__`. `bench.interrupt`, which both import, ends a run
killed with SIGTERM through its cleanups, as Ctrl-C does.
"""
