# Valka: `make run` brings up the local stack, `make test` runs the suite.
# Both set up everything they need on a fresh machine (Python 3.13 and the
# PostgreSQL server binaries are the only prerequisites).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install run test chaos lint proto clean-db

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 13) else "Valka needs Python 3.13 or newer: found " + sys.version.split()[0])'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

run: install
	$(PY) -m valka.devstack

test: install
	scripts/ensure-chromium
	$(PY) -m valka.devdb exec --temp -- $(PY) -m pytest $(PYTEST_ARGS)

# The long chaos run: 10,000 tasks while processes are killed and PostgreSQL restarts.
chaos: install
	$(PY) -m tests.chaos.harness --tasks $${CHAOS_TASKS:-10000} --seconds $${CHAOS_SECONDS:-420}

lint: install
	$(VENV)/bin/ruff check .

clean-db:
	-$(PY) -m valka.devdb stop
	rm -rf .valka/pg

# Regenerate the Python code of the valka.v1 protocol (committed; a test checks it is fresh).
proto: install
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/valka/v1/*.proto
