"""One way to start an asyncio gRPC server: health, reflection, graceful stop.

Every pdserve service calls `serve(...)` with its servicers; the server answers
the standard `grpc.health.v1.Health` check (SERVING once started, NOT_SERVING
while draining) and server reflection for `grpcurl`-style debugging.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

log = logging.getLogger(__name__)

# Registration hook: (servicer, server) -> None, e.g. router_pb2_grpc.add_RouterServicer_to_server.
Registration = tuple[Callable[[object, grpc.aio.Server], None], object, str]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


async def start_server(listen: str, registrations: Iterable[Registration]) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """Start a server on `listen` (host:port, port 0 = pick one); returns (server, port, health)."""
    server = grpc.aio.server(options=[
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
    ])
    names = [reflection.SERVICE_NAME, health.SERVICE_NAME]
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for add, servicer, full_name in registrations:
        add(servicer, server)
        names.append(full_name)
    reflection.enable_server_reflection(names, server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    for name in names[2:] + [""]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port, health_servicer


async def wait_for_shutdown(server: grpc.aio.Server, health_servicer, grace_s: float = 2.0,
                            on_stop: Callable[[], object] | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then report NOT_SERVING, run on_stop, and stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await health_servicer.enter_graceful_shutdown()
    if on_stop is not None:
        res = on_stop()
        if asyncio.iscoroutine(res):
            await res
    await server.stop(grace_s)


def split_address(addr: str) -> tuple[str, int]:
    """'host:port' -> (host, port)."""
    host, _, port = addr.rpartition(":")
    return host or "127.0.0.1", int(port)


def setup_logging(service: str, level: str = "INFO") -> None:
    """One log format for every service: time, service, level, logger, message."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )
