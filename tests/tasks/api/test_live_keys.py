"""The web app's memory of live API keys (tasks.api.live_keys), against PostgreSQL's own NOTIFY:
a key is read once while the process listens and forgotten when it is revoked, changed or
deleted; nothing is remembered while nothing listens, and a look-up that a change overtook is
not kept. The last tests run the web app and a dispatcher and revoke a key under their callers."""

from __future__ import annotations

import threading
import time

import grpc
import httpx
import psycopg
import pytest
from django.db import connection

from tasks.api import auth
from tasks.api.live_keys import LiveKeys
from tasks.models import ApiKey, Task
from tests.helpers import database_url, wait_for
from valka.db import conninfo
from valka_sdk.v1 import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.django_db(transaction=True)  # the changes commit, so their NOTIFYs go out


class Reads:
    """A look-up of the table that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, key_hash: str) -> ApiKey | None:
        self.calls += 1
        return ApiKey.objects.filter(key_hash=key_hash, revoked=False).first()


@pytest.fixture
def keys():
    remembered = LiveKeys()
    remembered.start(lambda: conninfo(application_name="valka-test live keys", direct=True))
    remembered.listen()
    wait_for(lambda: remembered.listening, 10, what="the LISTEN")
    yield remembered
    remembered.stop()
    assert not remembered.listening


def heard(keys: LiveKeys) -> None:
    """Wait until every notification committed so far has reached `keys`: a marker key is changed
    and its notification awaited (NOTIFYs arrive in commit order)."""
    marker, _ = auth.api_key_create(name="marker")
    reads = Reads()

    def remembered() -> bool:
        before = reads.calls
        assert keys.get(marker.key_hash, reads) is not None
        return reads.calls == before

    wait_for(remembered, 5, what="the marker remembered")
    ApiKey.objects.filter(pk=marker.pk).update(name="marker, changed")
    wait_for(lambda: not remembered(), 5, what="the marker's change heard")


def test_a_live_key_is_read_once_while_the_process_listens(keys):
    record, _ = auth.api_key_create(name="svc")
    reads = Reads()
    for _ in range(3):
        assert keys.get(record.key_hash, reads).pk == record.pk
    assert reads.calls == 1
    unknown = Reads()
    for _ in range(2):
        assert keys.get("0" * 64, unknown) is None
    assert unknown.calls == 2  # a key that is not live is never remembered


def test_nothing_is_remembered_before_the_process_listens():
    record, _ = auth.api_key_create(name="svc")
    reads = Reads()
    idle = LiveKeys()
    for _ in range(3):
        assert idle.get(record.key_hash, reads).pk == record.pk
    assert reads.calls == 3


@pytest.mark.parametrize("change", ["revoked", "scope", "name", "deleted", "truncated"])
def test_a_key_changed_is_read_again_at_once(keys, change):
    record, _ = auth.api_key_create(name="svc")
    reads = Reads()
    assert keys.get(record.key_hash, reads) is not None
    rows = ApiKey.objects.filter(pk=record.pk)
    if change == "revoked":
        rows.update(revoked=True)
    elif change == "scope":
        rows.update(scope=ApiKey.Scope.READ)
    elif change == "name":
        rows.update(name="svc, renamed")
    elif change == "deleted":
        rows.delete()
    else:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE api_keys")
    heard(keys)
    now = keys.get(record.key_hash, reads)
    assert reads.calls == 2
    if change == "scope":
        assert now.scope == ApiKey.Scope.READ
    elif change == "name":
        assert now.name == "svc, renamed"
    else:
        assert now is None


def test_noting_a_keys_use_does_not_make_it_read_again(keys):
    record, _ = auth.api_key_create(name="svc")
    reads = Reads()
    remembered = keys.get(record.key_hash, reads)
    auth.note_use(remembered)  # its first use: last_used_at is written
    assert remembered.last_used_at is not None
    heard(keys)
    assert keys.get(record.key_hash, reads) is remembered and reads.calls == 1
    assert ApiKey.objects.get(pk=record.pk).last_used_at == remembered.last_used_at
    auth.note_use(remembered)  # within the minute: nothing written
    assert ApiKey.objects.get(pk=record.pk).last_used_at == remembered.last_used_at


def test_a_look_up_overtaken_by_a_revocation_is_not_kept(keys):
    """The key is read live; its revocation commits and is heard before the read returns: the
    read is answered, but not remembered, and the next look-up reads the table."""
    record, _ = auth.api_key_create(name="svc")

    def read_then_revoked(key_hash: str) -> ApiKey | None:
        found = ApiKey.objects.get(key_hash=key_hash, revoked=False)
        ApiKey.objects.filter(pk=found.pk).update(revoked=True)
        heard(keys)
        return found

    assert keys.get(record.key_hash, read_then_revoked) is not None
    reads = Reads()
    assert keys.get(record.key_hash, reads) is None and reads.calls == 1


def test_a_lost_connection_forgets_every_key_until_it_listens_again(keys):
    record, _ = auth.api_key_create(name="svc")
    reads = Reads()
    keys.get(record.key_hash, reads)
    with psycopg.connect(database_url(), autocommit=True) as admin:
        ended = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = current_database() AND application_name = 'valka-test live keys'"
                              ).fetchall()
    assert ended == [(True,)]
    wait_for(lambda: not keys.listening, 5, what="the lost connection noticed")
    # Whatever changed meanwhile was not heard: every key is read again once the LISTEN is back.
    wait_for(lambda: keys.listening, 10, what="the LISTEN back")
    keys.get(record.key_hash, reads)
    keys.get(record.key_hash, reads)
    assert reads.calls == 2


def test_an_entry_is_read_again_after_its_age():
    record, _ = auth.api_key_create(name="svc")
    keys = LiveKeys(max_age=0.2)
    keys.start(lambda: conninfo(application_name="valka-test live keys", direct=True))
    keys.listen()
    try:
        wait_for(lambda: keys.listening, 10, what="the LISTEN")
        reads = Reads()
        keys.get(record.key_hash, reads)
        keys.get(record.key_hash, reads)
        assert reads.calls == 1
        time.sleep(0.25)
        keys.get(record.key_hash, reads)
        assert reads.calls == 2
    finally:
        keys.stop()


def test_the_listen_opens_at_the_first_look_up_and_closes_when_keys_go_unused():
    """PostgreSQL wakes every listening session of the database at each NOTIFY: a process whose
    keys nobody looks up holds no LISTEN. A key looked up opens it; `linger` seconds without a
    look-up close it, and every key is forgotten then; the next look-up opens it again."""
    record, _ = auth.api_key_create(name="svc")
    keys = LiveKeys(linger=0.5)
    keys.start(lambda: conninfo(application_name="valka-test live keys", direct=True))
    try:
        time.sleep(0.3)
        assert not keys.listening and not listening("valka-test live keys")
        reads = Reads()
        keys.get(record.key_hash, reads)  # read from the table: nothing was listening
        wait_for(lambda: listening("valka-test live keys"), 10, what="the LISTEN opened by the look-up")
        wait_for(lambda: keys.listening, 5, what="the LISTEN noted")
        for _ in range(4):  # looked up more often than `linger`: it stays open, the key remembered
            assert keys.get(record.key_hash, reads) is not None
            time.sleep(0.2)
        assert keys.listening
        remembered = reads.calls
        wait_for(lambda: not keys.listening, 5, what="the LISTEN closed for want of look-ups")
        keys.get(record.key_hash, reads)  # at once, while the listener's thread is still ending
        assert reads.calls == remembered + 1  # forgotten with the LISTEN
        wait_for(lambda: keys.listening, 10, what="the LISTEN opened again")
        wait_for(lambda: not keys.listening, 5, what="the LISTEN closed again")
        wait_for(lambda: not listening("valka-test live keys"), 5, what="its connection gone")
    finally:
        keys.stop()
    assert not keys.listening
    keys.get(record.key_hash, Reads())  # once stopped, a look-up opens nothing
    time.sleep(0.3)
    assert not keys.listening and not listening("valka-test live keys")


def listening(application_name: str) -> bool:
    """Whether a process's memory of keys (named by its connection) is LISTENing."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND application_name = %s AND query = 'LISTEN valka_api_key_changed'", [application_name])
        return cursor.fetchone()[0] == 1


def test_the_web_app_refuses_a_key_as_soon_as_it_is_revoked(stack):
    """The web app as served: its callers' key is revoked while they create tasks; every create
    answered after the revocation was heard is a 401, and none of them wrote a task."""
    web = stack.web(VALKA_API_ANONYMOUS="false")
    record, key = auth.api_key_create(name="svc")

    answers: list[tuple[float, int]] = []
    stop = threading.Event()

    def call() -> None:
        with httpx.Client(base_url=web, headers={"Authorization": f"Bearer {key}"}) as http:
            while not stop.is_set():
                status = http.post("/api/v1/tasks", json={"task_name": "t", "queue": "revoked"}).status_code
                answers.append((time.monotonic(), status))

    callers = [threading.Thread(target=call) for _ in range(2)]
    for caller in callers:
        caller.start()
    try:
        wait_for(lambda: sum(status == 201 for _, status in answers) >= 20, 20, what="creates with the key")
        # The first look-up opened the LISTEN (tasks.api.live_keys): the revocation comes once it hears.
        wait_for(lambda: listening("valka-web api keys"), 10, what="the web app's LISTEN")
        ApiKey.objects.filter(pk=record.pk).update(revoked=True)
        revoked = time.monotonic()
        wait_for(lambda: any(at > revoked and status == 401 for at, status in answers), 5, what="a 401")
        first_refusal = min(at for at, status in answers if at > revoked and status == 401)
        time.sleep(0.3)
    finally:
        stop.set()
        for caller in callers:
            caller.join(10)
    assert first_refusal - revoked < 1.0
    after = [status for at, status in answers if at > first_refusal + 0.1]
    assert after and set(after) == {401}
    assert {status for _, status in answers} == {201, 401}
    assert Task.objects.filter(queue="revoked").count() == sum(status == 201 for _, status in answers)


def test_the_dispatcher_refuses_a_key_as_soon_as_it_is_revoked(stack):
    """gRPC's ApiService, on a dispatcher as `run_dispatcher` starts it, remembers its callers' keys
    too: a key revoked is refused from the next call once the revocation is heard."""
    _, addr = stack.dispatcher(VALKA_API_ANONYMOUS="false")
    record, key = auth.api_key_create(name="grpc")
    request = api_pb2.CreateTaskRequest(queue_name="revoked", task_name="t")
    assert not listening("valka-dispatcher api keys")  # no look-up yet, so no LISTEN
    with grpc.insecure_channel(addr) as channel:
        api = api_pb2_grpc.ApiServiceStub(channel)
        api.CreateTask(request, metadata=(("authorization", f"Bearer {key}"),))
        wait_for(lambda: listening("valka-dispatcher api keys"), 10, what="the dispatcher's LISTEN")
        for _ in range(3):
            api.CreateTask(request, metadata=(("authorization", f"Bearer {key}"),))
        ApiKey.objects.filter(pk=record.pk).update(revoked=True)

        def refused() -> bool:
            try:
                api.CreateTask(request, metadata=(("authorization", f"Bearer {key}"),))
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.UNAUTHENTICATED
                return True
            return False

        revoked = time.monotonic()
        wait_for(refused, 5, what="the revoked key refused")
        assert time.monotonic() - revoked < 1.0
        with pytest.raises(grpc.RpcError):
            api.CreateTask(request, metadata=(("authorization", f"Bearer {key}"),))
