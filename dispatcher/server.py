"""The dispatcher's gRPC server: WorkerService, ApiService, health and reflection.

The port speaks TLS when VALKA_GRPC_TLS_CERT and VALKA_GRPC_TLS_KEY are set, and mutual TLS
when VALKA_GRPC_TLS_CLIENT_CA is set too: every client (workers and ApiService callers alike)
then presents a certificate that CA signed, and a worker's certificate names it (its common
name, see dispatcher/worker_service.py). Without them the port is plaintext. docs/security.md
shows a setup with self-signed certificates.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import ssl
from dataclasses import dataclass

import grpc
from django.core.management.base import CommandError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dispatcher.api_service import ApiService
from dispatcher.node import DispatcherNode
from dispatcher.protocol import MAX_MESSAGE
from dispatcher.worker_service import WorkerService
from valka.conf import valka_settings
from valka_sdk.v1 import api_pb2, api_pb2_grpc, worker_pb2, worker_pb2_grpc

log = logging.getLogger("valka.dispatcher")

SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    # Find dead peers: ping idle connections, drop those that stop answering.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.so_reuseport", 0),
]
SERVICES = ("valka.v1.WorkerService", "valka.v1.ApiService")


class TLSConfigError(CommandError):
    """The TLS settings cannot be used; a CommandError, so `run_dispatcher` prints it as one line."""


@dataclass(frozen=True)
class ServerTLS:
    credentials: grpc.ServerCredentials
    mutual: bool  # clients present a certificate signed by the client CA


def _reason(exc: Exception) -> str:
    return re.sub(r" \(_ssl\.c:\d+\)$", "", str(exc))


def _read(setting: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TLSConfigError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None


def server_tls(cert: str, key: str, client_ca: str = "") -> ServerTLS | None:
    """The port's credentials from the paths of PEM files (VALKA_GRPC_TLS_CERT, _KEY, _CLIENT_CA),
    or None for a plaintext port. Raises TLSConfigError, naming the setting, when they cannot be used."""
    if not cert and not key:
        if client_ca:
            raise TLSConfigError("VALKA_GRPC_TLS_CLIENT_CA is set but VALKA_GRPC_TLS_CERT and VALKA_GRPC_TLS_KEY "
                                 "are not: mutual TLS needs the dispatcher's certificate and key too")
        return None
    if not cert or not key:
        missing, present = ("VALKA_GRPC_TLS_CERT", "VALKA_GRPC_TLS_KEY") if not cert else (
            "VALKA_GRPC_TLS_KEY", "VALKA_GRPC_TLS_CERT")
        raise TLSConfigError(f"{present} is set but {missing} is not: set both (the certificate and its private "
                             "key, PEM files) for TLS, or neither")
    chain, private_key = _read("VALKA_GRPC_TLS_CERT", cert), _read("VALKA_GRPC_TLS_KEY", key)
    # gRPC reads the files only at the first handshake; load them here so a bad one stops the start.
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, ValueError) as exc:
        raise TLSConfigError(f"VALKA_GRPC_TLS_CERT, VALKA_GRPC_TLS_KEY: {cert} and {key} are not a certificate and "
                             f"its private key (PEM files): {_reason(exc)}") from None
    roots = None
    if client_ca:
        roots = _read("VALKA_GRPC_TLS_CLIENT_CA", client_ca)
        try:
            ssl.create_default_context(cafile=client_ca)
        except (ssl.SSLError, ValueError) as exc:
            raise TLSConfigError(f"VALKA_GRPC_TLS_CLIENT_CA: {client_ca} holds no PEM certificate: "
                                 f"{_reason(exc)}") from None
    credentials = grpc.ssl_server_credentials([(private_key, chain)], root_certificates=roots,
                                              require_client_auth=roots is not None)
    return ServerTLS(credentials=credentials, mutual=roots is not None)


class Dispatcher:
    def __init__(self, addr: str, node: DispatcherNode | None = None) -> None:
        self.addr = addr
        # First, so a bad TLS setting stops the start before anything else is built.
        self.tls = server_tls(valka_settings.GRPC_TLS_CERT, valka_settings.GRPC_TLS_KEY,
                              valka_settings.GRPC_TLS_CLIENT_CA)
        self.node = node or DispatcherNode()
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(
            WorkerService(self.node.handler, worker_token=self.node.settings.worker_token,
                          node_id=self.node.settings.node_id,
                          max_concurrency=self.node.settings.max_worker_concurrency,
                          mutual_tls=self.tls is not None and self.tls.mutual), self.server)
        api_pb2_grpc.add_ApiServiceServicer_to_server(ApiService(self.node.fanout), self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (
            worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
            api_pb2.DESCRIPTOR.services_by_name["ApiService"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, self.server)
        if self.tls is None:
            self.port = self.server.add_insecure_port(addr)
        else:
            self.port = self.server.add_secure_port(addr, self.tls.credentials)
        if self.port == 0:
            raise OSError(f"cannot listen on {addr}")

    async def start(self) -> None:
        await self.node.start()
        await self.server.start()
        for name in ("", *SERVICES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.tls is None:
            transport = "plaintext (no TLS: set VALKA_GRPC_TLS_CERT and VALKA_GRPC_TLS_KEY to encrypt)"
        elif self.tls.mutual:
            transport = "mutual TLS (clients present a certificate; a worker's names it)"
        else:
            transport = "TLS"
        token = "a worker token" if self.node.settings.worker_token else "no worker token"
        log.info("dispatcher %s listening on %s: %s, %s", self.node.settings.node_id, self.addr, transport, token)

    async def stop(self, timeout: float | None = None) -> None:
        for name in ("", *SERVICES):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.node.stop(timeout)
        await self.server.stop(grace=1.0)

    async def serve_forever(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("dispatcher %s: shutting down, draining workers", self.node.settings.node_id)
        await self.stop()
        log.info("dispatcher %s: stopped", self.node.settings.node_id)
