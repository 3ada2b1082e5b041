"""The front's listener: uvicorn (httptools, the asyncio loop the router already runs)
serving the Front's app in the router's own process and loop, beside its gRPC server.
Chosen by measurement: bench/results/http_stacks.md."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import uvicorn

from runtime.security.tls import Security

log = logging.getLogger(__name__)

KEEP_ALIVE_S = 65


class _InProcess(uvicorn.Server):
    """uvicorn without its signal handlers: the router's own SIGTERM handling stops it."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class HttpListener:
    """A started front: its port, and `close` to stop it (in-flight streams are cancelled,
    so their requests tear down)."""

    def __init__(self, server: _InProcess, task: asyncio.Task, port: int, scheme: str):
        self._server = server
        self._task = task
        self.port = port
        self.scheme = scheme

    async def close(self) -> None:
        self._server.should_exit = True
        self._server.force_exit = True  # do not wait for open streams: their requests are cancelled
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def _bind(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle off only on sockets whose proto says TCP
    # (base_events._set_nodelay), and connections inherit it. With proto 0 each SSE chunk
    # after the first waited for the client's delayed ACK: ~40 ms of TTFT and tokens bunched.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, int(port)))
    sock.set_inheritable(True)
    return sock


async def start_http(app, address: str, security: Security) -> HttpListener:
    """Serve `app` on `address` (host:port; port 0 picks one), HTTPS with the router's
    certificate unless insecure."""
    ctx = security.https_ssl()
    config = uvicorn.Config(app, http="httptools", loop="none", lifespan="off", log_config=None, interface="asgi3",
                            access_log=False, server_header=False, timeout_graceful_shutdown=1,
                            # Idle kept-alive connections live past a load balancer's 60 s idle
                            # timeout (the balancer closes first, never a request on a dying
                            # connection), not uvicorn's 5 s (a TLS handshake again after each pause).
                            timeout_keep_alive=KEEP_ALIVE_S,
                            ssl_context_factory=(lambda _config, _default: ctx) if ctx is not None else None)
    sock = _bind(address)
    server = _InProcess(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="http front")
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it
        await asyncio.sleep(0.005)
    port = sock.getsockname()[1]
    scheme = "https" if ctx is not None else "http"
    log.info("OpenAI-compatible front on %s://%s:%d/v1", scheme, address.rpartition(":")[0] or "0.0.0.0", port)
    return HttpListener(server, task, port, scheme)
