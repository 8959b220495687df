"""The peers' side of `make bench-peers`: Celery+Redis and Procrastinate, run inside `.venv-peers`.

Nothing here imports Django or Valka. `python -m bench.peers.run NAME ...` runs one peer's
workloads (starting and stopping its worker) and prints the figures as JSON.
"""
