"""/metrics of one process over HTTPS with client certificates (HTTP when insecure).

prometheus_client's WSGI app renders the registry (OpenMetrics, with exemplars, when
the scraper's Accept header asks for it; Prometheus text otherwise) on a threaded
wsgiref server of its own, beside the process's gRPC port. With security on, the
socket speaks TLS 1.3 with the cluster's CA (`Security.server_ssl`: a client
certificate is required, so a caller without one fails the handshake), and only the
roles in `READERS` may read: any other certificate gets 403. PD_INSECURE=1: plain
HTTP for anyone.

    server = serve_metrics("127.0.0.1:0", registry, security)
    server.url   # https://127.0.0.1:PORT/metrics
    server.close()
"""

from __future__ import annotations

import logging
import ssl
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from runtime.security.tls import Security, peer_of_ssl

log = logging.getLogger(__name__)

READERS = frozenset({"operator", "monitor"})
"""Certificate roles that may read /metrics (monitor: a Prometheus scraper's)."""
HANDSHAKE_TIMEOUT_S = 5.0
"""A client that does not finish its TLS handshake within this is dropped."""
_PEER = "pdserve.peer"
"""WSGI environ key of the caller's verified identity (None: none presented or insecure)."""


class _Handler(WSGIRequestHandler):
    """Puts the TLS peer's identity in the environ; logs no request line."""

    def get_environ(self):
        env = super().get_environ()
        try:
            env[_PEER] = peer_of_ssl(self.connection) if isinstance(self.connection, ssl.SSLSocket) else None
        except ValueError:  # a certificate from the CA that names no pdserve role
            env[_PEER] = None
        return env

    def log_message(self, format, *args):
        pass


class _Server(ThreadingWSGIServer):
    """Threaded; each connection's TLS handshake runs in its own thread, so a client
    that stalls mid-handshake holds up nobody else."""

    def finish_request(self, request, client_address):
        if isinstance(request, ssl.SSLSocket):
            request.settimeout(HANDSHAKE_TIMEOUT_S)
            request.do_handshake()
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address):
        # A refused handshake (no or untrusted certificate) or a dropped client: routine.
        log.debug("metrics connection from %s failed", client_address, exc_info=True)


def guarded(app, readers: frozenset[str] = READERS):
    """`app` answering only callers whose certificate's role is in `readers`; 403 otherwise."""
    def guarded_app(environ, start_response):
        who = environ.get(_PEER)
        if who is None or who.role not in readers:
            start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8")])
            allowed = ", ".join(sorted(readers))
            return [f"/metrics: {who or 'no pdserve certificate'} may not read metrics "
                    f"(allowed roles: {allowed})\n".encode()]
        return app(environ, start_response)
    return guarded_app


class MetricsServer:
    """A running /metrics endpoint; `url` is where to scrape it."""

    def __init__(self, listen: str, registry: CollectorRegistry, security: Security):
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        app = make_wsgi_app(registry)
        ctx = security.server_ssl()
        self._httpd = make_server(host, int(port), app if ctx is None else guarded(app), _Server,
                                  handler_class=_Handler)
        if ctx is not None:
            self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self.port = self._httpd.server_address[1]
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        self.url = f"{'https' if ctx is not None else 'http'}://{shown}:{self.port}/metrics"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def serve_metrics(listen: str, registry: CollectorRegistry, security: Security) -> MetricsServer | None:
    """Serve `registry` on `listen` (host:port, port 0 picks one); None when `listen` is
    empty (metrics off). Logs the URL."""
    if not listen:
        return None
    server = MetricsServer(listen, registry, security)
    log.info("metrics at %s", server.url)
    return server
