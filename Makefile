# Valka: `make run` brings up the local stack, `make test` runs the suite.
# Both set up everything they need on a fresh machine (Python 3.13 and the
# PostgreSQL server binaries are the only prerequisites).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# Test processes (pytest-xdist): most tests wait on processes and PostgreSQL, so more than the cores.
PYTEST_WORKERS ?= 3

.PHONY: install run test chaos lint proto clean-db

$(STAMP): pyproject.toml sdk/pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 13) else "Valka needs Python 3.13 or newer: found " + sys.version.split()[0])'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	@# One call: the server's dependency on valka-sdk is met by ./sdk, with no index lookup for it.
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e './sdk[django,otel]' -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

run: install
	$(PY) -m valka.devstack

test: install
	scripts/ensure-chromium
	$(PY) -m valka.devdb exec --temp -- $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The long chaos run: 10,000 tasks while processes are killed and PostgreSQL restarts.
chaos: install
	$(PY) -m tests.chaos.harness --tasks $${CHAOS_TASKS:-10000} --seconds $${CHAOS_SECONDS:-420}

lint: install
	$(VENV)/bin/ruff check .

clean-db:
	-$(PY) -m valka.devdb stop
	rm -rf .valka/pg

# Regenerate the Python code of the valka.v1 protocol into the SDK (committed; a test checks it is
# fresh). protoc's imports of `valka.v1` are rewritten to `valka_sdk.v1`: see the script.
proto: install
	$(PY) scripts/generate_proto.py

# Benchmarks (see README, "Performance"): a private durable PostgreSQL, the stack, the workloads.
# BENCH_ARGS passes options, e.g. make bench BENCH_ARGS="--n 20000 --workers 2".
BENCH_ARGS ?=
BENCH_STAMP := $(VENV)/.bench-stamp
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed-stamp

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e './sdk[django,otel]' -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench $(BENCH_ARGS)

# The peers live in a virtualenv of their own; Redis is Debian's redis-server on a private port.
$(PEERS_STAMP): bench/peers/requirements.txt
	@test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --disable-pip-version-check -r bench/peers/requirements.txt
	@touch $(PEERS_STAMP)

bench-peers: $(BENCH_STAMP) $(PEERS_STAMP)
	@command -v redis-server >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }
	$(PY) -m bench --peers $(BENCH_ARGS)
