"""valka-sdk installs alone: a fresh virtualenv with `./sdk[django]` has no server packages (no
top-level `tasks`, `signals`, `dispatcher` or `valka` to collide with a project's apps), needs no
PostgreSQL, and its Django backend loads and passes its checks (with no `URL` it fails them: there
is no server to enqueue in); without the `otel` extra it has OpenTelemetry's API only, and records
nothing. pip's cache keeps it quick."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT

PROBE = """
import importlib.util, sys
import django
from django.conf import settings

missing = [name for name in ("tasks", "signals", "dispatcher", "valka", "psycopg") if importlib.util.find_spec(name)]
assert not missing, f"installed beside the SDK: {missing}"
settings.configure(INSTALLED_APPS=["valka_sdk.django"], USE_TZ=True,
                   DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
                   TASKS={"default": {"BACKEND": "valka_sdk.django.ValkaBackend",
                                      "OPTIONS": {"URL": "http://127.0.0.1:1", "DISPATCHER": "127.0.0.1:2"}}})
django.setup()
from django.core.management import call_command, get_commands
from django.tasks import task_backends
call_command("check")
assert "valka_worker" in get_commands()
assert type(task_backends["default"]).__module__ == "valka_sdk.django.backend"
import valka_sdk, valka_sdk.v1.worker_pb2
# No URL, and no Valka project to enqueue in: a system check, and ImproperlyConfigured at enqueue.
from django.core.exceptions import ImproperlyConfigured
from django.tasks import Task
from valka_sdk.django import ValkaBackend
bare = ValkaBackend("bare", {"QUEUES": ["default"], "OPTIONS": {}})
assert [m.id for m in bare.check()] == ["valka_sdk.E002"], bare.check()
def ping(): pass
try:
    bare.enqueue(Task(func=ping), (), {})
except ImproperlyConfigured as exc:
    assert "has no 'URL'" in str(exc), exc
else:
    raise AssertionError("enqueued with no URL")
# OpenTelemetry's API alone (no `otel` extra): asked for traces, the SDK says what is missing and records nothing.
import os
assert importlib.util.find_spec("opentelemetry.trace") and not importlib.util.find_spec("opentelemetry.sdk")
os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:1"
from valka_sdk import tracing
assert tracing.configure("probe") is False and tracing.tracer() is None
print("alone")
"""


@pytest.mark.timeout(180)
def test_the_sdk_installs_alone_without_the_server(tmp_path):
    source = tmp_path / "sdk"
    shutil.copytree(ROOT / "sdk", source, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c",
                    str(ROOT / "constraints.txt"), f"{source}[django]"], check=True, timeout=150)
    probe = subprocess.run([python, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.splitlines()[-1] == "alone"
