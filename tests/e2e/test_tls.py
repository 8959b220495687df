"""TLS and mutual TLS on the dispatcher's port, with the certificates docs/security.md makes: SDK
workers complete tasks over TLS, plaintext clients and clients without a certificate cannot open a
session, and with mutual TLS a worker's id must be its certificate's common name (or `<name>:...`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from tasks import services
from tasks.models import Worker
from tests.helpers import ROOT, Feeder, hello, wait_for, wait_status
from valka.devdb import free_port
from valka_sdk.v1 import worker_pb2_grpc

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="the openssl binary is needed to make the test certificates")

# The workers connect to 127.0.0.1; the docs' example names a host.
SAN = "DNS:localhost,IP:127.0.0.1"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """The docs' openssl block, run as it stands with this test's subjectAltName: ca, dispatcher, w1."""
    text = (ROOT / "docs" / "security.md").read_text()
    block = next(b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "openssl req" in b)
    block, replaced = re.subn(r'^DISPATCHER_SAN=.*$', f'DISPATCHER_SAN="{SAN}"', block, count=1, flags=re.M)
    assert replaced == 1, "docs/security.md: the openssl block no longer sets DISPATCHER_SAN"
    folder = tmp_path_factory.mktemp("tls")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=folder, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("ca.crt", "dispatcher.crt", "dispatcher.key", "w1.crt", "w1.key"):
        assert (folder / name).is_file(), name
    return folder


def tls_env(certs: Path, mutual: bool = False) -> dict[str, str]:
    env = {"VALKA_GRPC_TLS_CERT": str(certs / "dispatcher.crt"), "VALKA_GRPC_TLS_KEY": str(certs / "dispatcher.key")}
    if mutual:
        env["VALKA_GRPC_TLS_CLIENT_CA"] = str(certs / "ca.crt")
    return env


def credentials(certs: Path, client: bool = False) -> grpc.ChannelCredentials:
    if not client:
        return grpc.ssl_channel_credentials(root_certificates=(certs / "ca.crt").read_bytes())
    return grpc.ssl_channel_credentials(root_certificates=(certs / "ca.crt").read_bytes(),
                                        private_key=(certs / "w1.key").read_bytes(),
                                        certificate_chain=(certs / "w1.crt").read_bytes())


def say_hello(addr: str, creds: grpc.ChannelCredentials | None, worker_id: str,
              token: str | None = None) -> tuple[grpc.StatusCode, str]:
    """Open a session and say hello: (OK, the worker id the dispatcher took) or (the status, its details)."""
    channel = grpc.secure_channel(addr, creds) if creds is not None else grpc.insecure_channel(addr)
    feeder = Feeder([hello(queues=("tls-raw",), worker_id=worker_id)])
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    try:
        call = worker_pb2_grpc.WorkerServiceStub(channel).Session(feeder, metadata=metadata, timeout=10)
        headers = dict(call.initial_metadata() or ())
        if "x-valka-worker-id" in headers:
            return grpc.StatusCode.OK, headers["x-valka-worker-id"]
        return call.code(), call.details() or ""
    finally:
        feeder.close()
        channel.close()


def test_tls_worker_completes_a_task_and_plaintext_is_refused(stack, certs):
    proc, addr = stack.dispatcher(**tls_env(certs))
    wait_for(lambda: "listening on" in proc.log_path.read_text(), what="the dispatcher's start line")
    assert re.search(r"listening on \S+: TLS, no worker token", proc.log_path.read_text())
    stack.worker(addr, queues="tls", name="tls", VALKA_TEST_TLS_CA=str(certs / "ca.crt"))
    task = services.task_enqueue(task_name="echo", queue="tls", input={"over": "tls"})
    assert wait_status(task.id, "COMPLETED", "FAILED").output["echo"] == {"over": "tls"}

    code, _ = say_hello(addr, None, "plain")
    assert code == grpc.StatusCode.UNAVAILABLE
    assert say_hello(addr, credentials(certs), "raw") == (grpc.StatusCode.OK, "raw")


def test_mutual_tls_names_the_worker_by_its_certificate(stack, certs):
    proc, addr = stack.dispatcher(**tls_env(certs, mutual=True))
    wait_for(lambda: "listening on" in proc.log_path.read_text(), what="the dispatcher's start line")
    assert "mutual TLS" in proc.log_path.read_text()
    client = {"VALKA_TEST_TLS_CA": str(certs / "ca.crt"), "VALKA_TEST_TLS_CERT": str(certs / "w1.crt"),
              "VALKA_TEST_TLS_KEY": str(certs / "w1.key")}
    stack.worker(addr, queues="mtls", name="w1a", VALKA_TEST_WORKER_ID="w1:a", **client)
    impostor = stack.worker(addr, queues="mtls", name="w2", VALKA_TEST_WORKER_ID="w2:a", **client)
    task = services.task_enqueue(task_name="echo", queue="mtls", input={"over": "mutual tls"})
    done = wait_status(task.id, "COMPLETED", "FAILED")
    assert done.output["worker"] == "w1a" and Worker.objects.get(id="w1:a").name == "w1a"

    # A worker id of another certificate's name: refused, and the SDK stops.
    assert impostor.wait(20) != 0
    log = impostor.log_path.read_text()
    assert "refused the session" in log and "'w2:a'" in log and "'w1'" in log, log
    assert not Worker.objects.filter(id="w2:a").exists()
    code, details = say_hello(addr, credentials(certs, client=True), "w10")  # a prefix is not the name
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "'w10' does not belong to the client certificate 'w1'" in details
    # No id: the certificate's name; no client certificate, or no TLS: no session.
    assert say_hello(addr, credentials(certs, client=True), "") == (grpc.StatusCode.OK, "w1")
    assert say_hello(addr, credentials(certs), "w1:b")[0] == grpc.StatusCode.UNAVAILABLE
    assert say_hello(addr, None, "w1:c")[0] == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_and_a_token_needs_both(stack, certs):
    _, addr = stack.dispatcher(VALKA_WORKER_TOKEN="s3cret-token", **tls_env(certs, mutual=True))
    creds = credentials(certs, client=True)
    assert say_hello(addr, creds, "w1:a")[0] == grpc.StatusCode.UNAUTHENTICATED
    assert say_hello(addr, creds, "w1:a", token="s3cret-token") == (grpc.StatusCode.OK, "w1:a")


@pytest.mark.parametrize("mutual", [True, False], ids=["mutual, its own CA", "system roots"])
def test_a_django_worker_takes_its_tls_options(stack, certs, tmp_path, mutual):
    """`manage.py valka_worker` over TLS (docs/django.md): `--tls-ca --tls-cert --tls-key` with
    mutual TLS, where the worker is the one its certificate names, and `--tls` (the SDK's
    `Worker(tls=True)`: the system's roots, here gRPC's GRPC_DEFAULT_SSL_ROOTS_FILE_PATH)."""
    _, addr = stack.dispatcher(**tls_env(certs, mutual=mutual))
    env = {"VALKA_DISPATCHER": addr, "SHOP_DB": str(tmp_path / "shop.sqlite3"), "SHOP_MARKS": str(tmp_path / "marks")}
    if mutual:
        args = ["--worker-id", "w1:django", "--tls-ca", str(certs / "ca.crt"), "--tls-cert", str(certs / "w1.crt"),
                "--tls-key", str(certs / "w1.key")]
    else:
        args = ["--worker-id", "roots", "--tls"]
        env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(certs / "ca.crt")
    stack.django_worker("--queue", "shop", *args, **env)
    task = services.task_enqueue(task_name="tests.django_project.shop.tasks.add", queue="shop",
                                 input={"args": [2, 3], "kwargs": {}})
    done = wait_status(task.id, "COMPLETED", "FAILED")
    assert done.status == "COMPLETED", stack.logs()
    assert [run.worker_id for run in done.runs.all()] == ["w1:django" if mutual else "roots"]


@pytest.mark.parametrize("settings, message", [
    ({"VALKA_GRPC_TLS_CERT": "{d}/dispatcher.crt"},
     "VALKA_GRPC_TLS_CERT is set but VALKA_GRPC_TLS_KEY is not"),
    ({"VALKA_GRPC_TLS_KEY": "{d}/dispatcher.key", "VALKA_GRPC_TLS_CLIENT_CA": "{d}/ca.crt"},
     "VALKA_GRPC_TLS_KEY is set but VALKA_GRPC_TLS_CERT is not"),
    ({"VALKA_GRPC_TLS_CERT": "{d}/missing.crt", "VALKA_GRPC_TLS_KEY": "{d}/dispatcher.key"},
     "VALKA_GRPC_TLS_CERT: cannot read {d}/missing.crt"),
    ({"VALKA_GRPC_TLS_CERT": "{d}/dispatcher.crt", "VALKA_GRPC_TLS_KEY": "{d}/w1.key"},
     "VALKA_GRPC_TLS_CERT, VALKA_GRPC_TLS_KEY: "),
    ({"VALKA_GRPC_TLS_CERT": "{d}/dispatcher.crt", "VALKA_GRPC_TLS_KEY": "{d}/dispatcher.key",
      "VALKA_GRPC_TLS_CLIENT_CA": "{d}/w1.key"},
     "VALKA_GRPC_TLS_CLIENT_CA: {d}/w1.key holds no PEM certificate"),
])
def test_unusable_tls_settings_stop_the_start_in_one_line(certs, settings, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VALKA_GRPC_TLS_")}
    env.update(VALKA_DEVELOPMENT="true", **{k: v.format(d=certs) for k, v in settings.items()})
    done = subprocess.run([sys.executable, "manage.py", "run_dispatcher", "--addr", f"127.0.0.1:{free_port()}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1, lines
    assert lines[0].startswith(f"TLSConfigError: {message.format(d=certs)}"), lines
