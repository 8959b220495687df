"""The dispatcher's gRPC server: WorkerService, ApiService, health and reflection."""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dispatcher.api_service import ApiService
from dispatcher.node import DispatcherNode
from dispatcher.protocol import MAX_MESSAGE
from dispatcher.worker_service import WorkerService
from valka.v1 import api_pb2, api_pb2_grpc, worker_pb2, worker_pb2_grpc

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


class Dispatcher:
    def __init__(self, addr: str, node: DispatcherNode | None = None) -> None:
        self.addr = addr
        self.node = node or DispatcherNode()
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(
            WorkerService(self.node.handler, worker_token=self.node.settings.worker_token,
                          node_id=self.node.settings.node_id,
                          max_concurrency=self.node.settings.max_worker_concurrency), self.server)
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
        self.port = self.server.add_insecure_port(addr)
        if self.port == 0:
            raise OSError(f"cannot listen on {addr}")

    async def start(self) -> None:
        await self.node.start()
        await self.server.start()
        for name in ("", *SERVICES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("dispatcher %s listening on %s", self.node.settings.node_id, self.addr)

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
