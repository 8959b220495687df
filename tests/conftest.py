"""Every shared fixture, and the `slow` marker. The helpers they use are in tests/helpers.py."""

import itertools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from rest_framework.test import APIClient

from tasks.api.auth import api_key_create
from tests.helpers import ROOT, Collector, Listener, Stack
from valka import devdb
from valka.devdb import free_port


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts real scheduler processes (a few seconds each)")
    config.addinivalue_line("markers", "long: takes half a minute or more (outages, chaos, a million rows); runs first")


def pytest_collection_modifyitems(config, items):
    """The long tests go first: `make test` hands the tests out to its workers one
    by one in this order (pytest-xdist, --dist loadgroup), so each of them starts on a worker of
    its own at once, and the short tests fill the other workers meanwhile."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's, and at the end a wait for the test database's other sessions to end before
    it drops the database.

    A process a test stopped may still have a backend on its way out (PostgreSQL notices a closed
    socket at its next read), and DROP DATABASE refuses while one is there. Two seconds are ample
    for that; a session still there after them (a connection a test's thread left open in this
    process, mostly) is ended, and named."""
    yield
    import time

    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cur:
        others = "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        deadline = time.monotonic() + 2
        while True:
            cur.execute(f"SELECT pid, application_name {others}")
            left = cur.fetchall()
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if left:
            cur.execute(f"SELECT pg_terminate_backend(pid) {others}")
            print(f"\nsessions still on the test database at the end, ended: {left}", file=sys.stderr)
    connection.close()


# -- The REST API. --

@pytest.fixture(autouse=True)
def offers_looked_for_afresh():
    """Each test's first single-task enqueue looks for an offered slot, whatever the test before
    it enqueued a moment ago (tasks/offer_misses.py)."""
    from tasks import offer_misses

    offer_misses.forget()


@pytest.fixture
def anon_client():
    return APIClient()


@pytest.fixture
def api_key(db):
    """A key that may do everything (scope admin); tests/tasks/api/test_permissions.py tries the others."""
    return api_key_create(name="tests", scope="admin")[1]


@pytest.fixture
def client_api(api_key):
    """An API client that sends a valid key."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key}")
    return client


# -- The console. --

_names = itertools.count()


@pytest.fixture
def staff_client(django_user_model):
    """A client logged in as a staff user holding exactly the given permissions ("app.codename")."""

    def make(*perms: str) -> Client:
        user = django_user_model.objects.create_user(f"staff{next(_names)}", is_staff=True)  # force_login: no password
        for perm in perms:
            app_label, codename = perm.split(".")
            user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        client = Client()
        client.force_login(user)
        return client

    return make


# -- Tracing. --

@pytest.fixture
def spans():
    """A tracer provider for this test that keeps its finished spans in memory (the exporter's
    `get_finished_spans()`); the process has none again afterwards."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.test.globals_test import reset_trace_globals

    from valka_sdk import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reset_trace_globals()
    trace.set_tracer_provider(provider)
    tracing.look_again()
    yield exporter
    provider.shutdown()
    reset_trace_globals()
    tracing.look_again()


@pytest.fixture
def collector():
    """An OTLP collector for the stack's processes: give them `collector.env` (tests.helpers.Collector)."""
    found = Collector()
    yield found
    found.stop()


# -- The real stack: dispatcher, scheduler, web and SDK workers as processes (tests.helpers.Stack). --

@pytest.fixture
def stack(transactional_db, tmp_path, request):
    """The stack's processes are killed at teardown; their logs are printed when the test failed."""
    s = Stack(tmp_path)
    yield s
    s.stop_all()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(s.logs())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report


# -- The scheduler. --

@pytest.fixture
def listen():
    """Opens `Listener`s on channels (valka_task_ready by default); closes them at teardown."""
    opened: list[Listener] = []

    def start(channel: str = "valka_task_ready") -> Listener:
        opened.append(Listener(channel))
        return opened[-1]

    yield start
    for listener in opened:
        listener.close()


@pytest.fixture
def own_cluster():
    """A throwaway PostgreSQL for one test, migrated, that the test may stop and start.

    Its files live outside pytest's temporary folders: a pytest-xdist worker that starts later
    takes back the access to those that devdb gives the server's user."""
    cluster = devdb.Cluster(Path(tempfile.mkdtemp(prefix="valka-test-pg-")), free_port(), durable=False)
    cluster.start()
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, check=True, timeout=120,
                   env={**os.environ, "DATABASE_URL": cluster.url, "VALKA_DB_POOL": "false"})
    yield cluster
    cluster.stop("immediate")
    cluster.remove_files()


@pytest.fixture
def own_stack(own_cluster, tmp_path, request):
    """The stack's processes on `own_cluster`, killed at teardown; their logs printed on failure."""
    stack = Stack(tmp_path, own_cluster.url)
    yield stack
    stack.stop_all()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(stack.logs())
