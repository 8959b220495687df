"""No secret reaches a log: not the database password (from DATABASE_URL), not the worker token,
not an API key, whether things go well or not."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import grpc
import httpx

from tasks import services
from tests.helpers import database_url, wait_for, wait_status
from valka.devdb import free_port
from valka_sdk.v1 import api_pb2, api_pb2_grpc

DB_PASSWORD = "db-pass-Zq81kXv3"
WORKER_TOKEN = "worker-token-Ny40pLw7"
API_KEY = "vk_api-key-Hs62mRt9"


def with_password(url: str, port: int | None = None) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{DB_PASSWORD}@{parts.hostname}:{port or parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def assert_no_secret(text: str) -> None:
    for secret in (DB_PASSWORD, WORKER_TOKEN, API_KEY, "Hs62mRt9"):
        assert secret not in text, f"{secret!r} logged:\n{text[-2000:]}"


def test_dispatcher_worker_and_web_logs_hold_no_secret(stack):
    # A password libpq sends and the (trust-authenticated) test server ignores.
    env = {"DATABASE_URL": with_password(database_url()), "VALKA_WORKER_TOKEN": WORKER_TOKEN,
           "VALKA_API_ANONYMOUS": "false", "VALKA_LOG_LEVEL": "DEBUG"}
    dispatcher, addr = stack.dispatcher(**env)
    stack.scheduler(**env)
    web = stack.web(**env)
    # Refusals: a worker with the wrong token, an API call with a wrong key (gRPC and REST).
    wrong = stack.worker(addr, name="wrong-token", VALKA_TEST_TOKEN=WORKER_TOKEN + "-not")
    with grpc.insecure_channel(addr) as channel:
        try:
            api_pb2_grpc.ApiServiceStub(channel).GetTask(api_pb2.GetTaskRequest(task_id="x"),
                                                          metadata=(("authorization", f"Bearer {API_KEY}"),))
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert_no_secret(err.details())
    r = httpx.get(f"{web}/api/v1/tasks", headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 401
    assert_no_secret(r.text)
    # And success: a worker with the token runs a task.
    stack.worker(addr, name="right-token", VALKA_TEST_TOKEN=WORKER_TOKEN)
    task = services.task_enqueue(task_name="echo", queue="default")
    wait_status(task.id, "COMPLETED")
    wait_for(lambda: wrong.poll() is not None or "UNAUTHENTICATED" in wrong.log_path.read_text(),  # type: ignore
             what="the wrong-token worker refused")
    logs = "\n".join(p.log_path.read_text() for p in stack.procs)  # type: ignore[attr-defined]
    assert f"listening on {addr}" in dispatcher.log_path.read_text()  # type: ignore[attr-defined]
    assert_no_secret(logs)


def test_database_errors_hold_no_password(stack):
    # Nothing listens on this port: the dispatcher and scheduler log their connection failures.
    env = {"DATABASE_URL": with_password(database_url(), port=free_port()), "VALKA_LOG_LEVEL": "DEBUG"}
    dispatcher, _ = stack.dispatcher(**env)
    scheduler = stack.scheduler(**env)

    def failures_logged() -> bool:
        text = dispatcher.log_path.read_text() + scheduler.log_path.read_text()  # type: ignore[attr-defined]
        return "refused" in text.lower() or "failed" in text.lower()

    wait_for(failures_logged, 30, what="connection failures in the logs")
    assert_no_secret("\n".join(p.log_path.read_text() for p in stack.procs))  # type: ignore[attr-defined]
