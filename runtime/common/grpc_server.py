"""One way to start an asyncio gRPC server: health, reflection, graceful stop.

Every pdserve service calls `start_server(...)` with its servicers; the server
answers the standard `grpc.health.v1.Health` check and server reflection for
`grpcurl`-style debugging. Health is readiness ("ready to serve"), overall ("")
and per service alike: a server started with `ready=False` answers NOT_SERVING
until its process calls `Readiness.ready(True)` (a worker once it holds a live
lease, the router once it reached the directory); `ready(False)` takes it back (a
worker's lease lost); once draining (SIGTERM) it is NOT_SERVING for good.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable, Mapping

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pdserve_client import contract
from runtime.security.tls import Access, Security
from runtime.telemetry import tracing

log = logging.getLogger(__name__)

# Registration hook: (servicer, server) -> None, e.g. router_pb2_grpc.add_RouterServicer_to_server.
Registration = tuple[Callable[[object, grpc.aio.Server], None], object, str]

MAX_MESSAGE_BYTES = contract.MAX_MESSAGE_BYTES
"""Largest control-plane message. K/V never travels over gRPC; the largest legal
message is a prompt (a 1M-token prompt is under 5 MiB of varints). Parsing costs
far more memory than the wire size (a Python int per token), so the cap is set
well below what a service can hold: 64 MiB let a 48 MB prompt cost the router
818 MB."""

RECONNECT_OPTIONS = [
    # A peer that was unreachable (restarted, or a blip) is tried again within a second,
    # not after gRPC's default reconnect backoff of up to two minutes, during which every
    # call fails at once: whether the peer is alive is the directory's lease to decide.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    # gRPC core reads this one as the minimum time a connection attempt may take (its
    # MIN_CONNECT_TIMEOUT), not as a floor on the backoff: at 200 ms a TLS handshake to a
    # busy peer (a 200-request burst against a cold channel, with tracing on) was cut
    # ("handshaker shutdown") and every call queued on it failed UNAVAILABLE.
    ("grpc.min_reconnect_backoff_ms", 5_000),
]
"""Client channel options for calls between pdserve's services."""
PING_OPTIONS = [
    # A router pings each worker connection every second while a call is open (its
    # keepalive: router/grpc_gateway.py), also while no data flows (a DecodeStream waiting
    # for publication). gRPC's server default takes one such ping per 5 minutes, and answers
    # the third with GOAWAY: every stream on the connection would be cut.
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
]
"""Server options: the peers' keepalive pings are welcome."""


class _Malformed:
    """Stands in for a request whose bytes did not parse."""

    __slots__ = ("error",)

    def __init__(self, error: Exception):
        self.error = error


class MalformedRequests(grpc.aio.ServerInterceptor):
    """A request that does not parse as its message is INVALID_ARGUMENT saying so,
    not UNKNOWN naming a Python class (gRPC's default for a deserializer error)."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        parse, method = handler.request_deserializer, handler_call_details.method

        def deserialize(data: bytes):
            try:
                return parse(data)
            except Exception as e:  # noqa: BLE001 - any parse failure is the caller's bad bytes
                return _Malformed(e)

        async def refuse(request, context):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{method}: the request is not a valid protobuf message of its type "
                                f"({type(request.error).__name__}: {request.error})")

        async def checked(requests, context):
            async for request in requests:
                if isinstance(request, _Malformed):
                    await refuse(request, context)
                yield request

        if handler.request_streaming and handler.response_streaming:  # the first malformed request ends it
            inner_both = handler.stream_stream

            async def both_behaviour(requests, context):
                async for item in inner_both(checked(requests, context), context):
                    yield item

            return grpc.stream_stream_rpc_method_handler(
                both_behaviour, request_deserializer=deserialize, response_serializer=handler.response_serializer)
        if handler.request_streaming:  # stream-unary: the first malformed request ends the call
            inner_requests = handler.stream_unary

            async def requests_behaviour(requests, context):
                return await inner_requests(checked(requests, context), context)

            return grpc.stream_unary_rpc_method_handler(
                requests_behaviour, request_deserializer=deserialize, response_serializer=handler.response_serializer)
        if handler.response_streaming:
            inner = handler.unary_stream

            async def behaviour(request, context):
                if isinstance(request, _Malformed):
                    await refuse(request, context)
                async for item in inner(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                behaviour, request_deserializer=deserialize, response_serializer=handler.response_serializer)
        inner = handler.unary_unary

        async def unary(request, context):
            if isinstance(request, _Malformed):
                await refuse(request, context)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary, request_deserializer=deserialize, response_serializer=handler.response_serializer)


class Readiness(health.aio.HealthServicer):
    """grpc.health.v1 over one readiness bit: every service of the server (and the
    overall "") is SERVING or NOT_SERVING together; after `enter_graceful_shutdown`
    (draining) `ready` changes nothing."""

    def __init__(self, names: Iterable[str]):
        super().__init__()
        self.names = ["", *names]
        self.is_ready: bool | None = None
        """The last state reported (None before the first)."""

    async def ready(self, serving: bool) -> None:
        """Report every service SERVING (`serving`) or NOT_SERVING."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        if self._gracefully_shutting_down or serving == self.is_ready:
            return
        self.is_ready = serving
        log.info("health: %s", "SERVING" if serving else "NOT_SERVING")
        for name in self.names:
            await self.set(name, status)

    @property
    def draining(self) -> bool:
        """True once the process began to stop (SIGTERM): NOT_SERVING for good."""
        return self._gracefully_shutting_down


class RefuseWhen(grpc.aio.ServerInterceptor):
    """Calls to `methods` (full names, "/pd.v1.Decode/Reserve") fail with `code` and the
    message `reason()` returns while it returns one (None: let the call run). A draining
    worker refuses new work UNAVAILABLE, so the caller retries elsewhere; a worker whose
    connector a rollback disabled refuses transfer work FAILED_PRECONDITION. Every other
    call (the streams of work already accepted, cancels) runs."""

    def __init__(self, methods: Iterable[str], reason: Callable[[], str | None], code: grpc.StatusCode):
        self.methods, self.reason, self.code = frozenset(methods), reason, code

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method not in self.methods:
            return handler
        reason, code = self.reason, self.code

        streaming_requests = handler.request_streaming

        async def refuse(context, requests=None) -> None:
            why = reason()
            if why is not None:
                if streaming_requests:  # its first request in first: a write racing the end of
                    await anext(aiter(requests), None)  # the call reads as INTERNAL at the caller
                await context.abort(code, f"{why} ({method})")

        if handler.response_streaming:
            kind = "unary_stream" if handler.unary_stream is not None else "stream_stream"
            inner_stream = getattr(handler, kind)

            async def stream(request, context):  # a request, or a stream-stream call's requests
                await refuse(context, request)
                async for item in inner_stream(request, context):
                    yield item

            return handler._replace(**{kind: stream})
        inner = handler.unary_unary or handler.stream_unary

        async def unary(request, context):  # a request, or a stream-unary call's requests
            await refuse(context, request)
            return await inner(request, context)

        if handler.unary_unary is not None:
            return handler._replace(unary_unary=unary)
        return handler._replace(stream_unary=unary)


async def start_server(listen: str, registrations: Iterable[Registration], security: Security,
                       access: Mapping[str, frozenset[str]], ready: bool = True,
                       new_work: Iterable[str] = (), draining_message: str = "draining",
                       refusals: Iterable[RefuseWhen] = ()) -> tuple[grpc.aio.Server, int, Readiness]:
    """Start a server on `listen` (host:port, port 0 = pick one); returns (server, port, health).

    With `security` secure, the port speaks mutual TLS and `access` ({/service/method:
    roles}, runtime/security/tls.py) decides who may call what; insecure, anyone may.
    Health is SERVING at once when `ready`; else NOT_SERVING until `health.ready(True)`.
    Once draining, the `new_work` methods fail UNAVAILABLE with `draining_message`;
    `refusals` refuse more calls on their own conditions."""
    registrations = list(registrations)
    health_servicer = Readiness([full_name for _, _, full_name in registrations])
    interceptors: list[grpc.aio.ServerInterceptor] = [*refusals, MalformedRequests()]
    if new_work:
        interceptors.insert(0, RefuseWhen(new_work, lambda: draining_message if health_servicer.draining else None,
                                          grpc.StatusCode.UNAVAILABLE))
    if security.secure:
        interceptors.insert(0, Access(access))
    interceptors[:0] = tracing.server_interceptors()  # outermost: a refused call is traced too
    server = grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
        *PING_OPTIONS,
    ])
    names = [reflection.SERVICE_NAME, health.SERVICE_NAME]
    for add, servicer, full_name in registrations:
        add(servicer, server)
        names.append(full_name)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(names, server)
    creds = security.server_credentials()
    port = server.add_insecure_port(listen) if creds is None else server.add_secure_port(listen, creds)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    await health_servicer.ready(False)  # before the port answers: never SERVING by default
    await server.start()
    await health_servicer.ready(ready)
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
