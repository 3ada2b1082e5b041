"""OpenTelemetry tracing for every pdserve process (docs/observability.md).

Off unless an OTLP endpoint is configured by the standard variables
(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT; the sampler by
OTEL_TRACES_SAMPLER[_ARG], read by the SDK itself). Off, nothing is installed: no
interceptor, no processor, the API's no-op tracer — tracing costs nothing. On, each
process gets its own `service.name` (pdserve-router, pdserve-prefill, ...) and
`service.instance.id` (the worker id), and spans leave through a batch processor
with a bounded queue: a dead collector costs dropped spans, never a slower request.
Its export thread runs at a lower scheduling priority (`EXPORT_NICE`, `_Background`):
encoding a batch takes milliseconds of CPU, which on shared cores would otherwise be
taken from a request's critical path.

How one request stays one trace:
- gRPC: W3C `traceparent` + `baggage` metadata, sent on every channel
  (`carrying_context`) and taken by an interceptor on every server (`server_interceptors`),
  which opens the call's SERVER span.
- the data plane (UCX, TCP are not gRPC): `inject` / `extract` over a dict carried in
  the hand-off's commit.
- work that outlives the RPC that started it (a reservation's transfer, a decode
  loop's tokens): the owner keeps `context.get_current()` and starts later spans with it.

The router puts pd.request_id, pd.tenant (and per attempt pd.generation,
pd.transfer_id, pd.route) in W3C baggage; every process copies `pd.*` baggage onto
each span it starts (BaggageSpanProcessor), so every span of a request carries them.
Only the router's own word counts: the router extracts `traceparent` from a client but
never its baggage (a client must not name another request id or tenant on our spans).

Where spans go (`exporter_for`): the endpoint's own PKI when the standard
OTEL_EXPORTER_OTLP_CERTIFICATE variables are set; plaintext for an http:// endpoint
(a local Jaeger); otherwise, when this process has certificates, mutual TLS to a
collector holding a `collector` certificate of the cluster's CA (runtime/telemetry/collector.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping

import grpc
import grpc.aio
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.processor.baggage import BaggageSpanProcessor
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pdserve_client import contract
from pdserve_client.spans import GENERATION, REQUEST_ID, ROUTE, TENANT, TRANSFER_ID

__all__ = ["REQUEST_ID", "GENERATION", "TRANSFER_ID", "ROUTE", "TENANT", "configure", "enabled",
           "tracer", "inject", "extract", "with_request", "span_in", "past_span", "current_context",
           "server_interceptors", "carrying_context"]

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
CERTIFICATE_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE")
EXPORT_NICE = 10
"""The nice value of the thread that encodes and sends span batches (0 = unchanged):
one step under a request's threads when cores are short, unchanged when they are not."""
MAX_QUEUE_SPANS = 8192
"""Spans waiting for export; beyond this they are dropped (and counted by the SDK)."""
EXPORT_TIMEOUT_S = 2.0
COLLECTOR_SERVICE = "collector"
"""The name a collector's certificate carries (contract.server_name) for mutual TLS."""

log = logging.getLogger(__name__)
_provider: TracerProvider | None = None
_tracer: trace.Tracer = trace.NoOpTracer()


def endpoint(environ: Mapping[str, str] | None = None) -> str:
    """The configured OTLP endpoint, or '' (tracing off)."""
    env = os.environ if environ is None else environ
    return next((env[v].strip() for v in ENDPOINT_VARIABLES if env.get(v, "").strip()), "")


def enabled() -> bool:
    """Is this process exporting spans?"""
    return _provider is not None


def exporter_for(url: str, files=None, environ: Mapping[str, str] | None = None):
    """The OTLP/gRPC exporter to `url` (see the module docstring for the TLS rule);
    `files` are this process's TlsFiles (None: it has none)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    env = os.environ if environ is None else environ
    address = url.split("://", 1)[-1]
    if any(env.get(v) for v in CERTIFICATE_VARIABLES):  # the exporter reads them itself
        return OTLPSpanExporter(endpoint=url, timeout=EXPORT_TIMEOUT_S)
    if url.startswith("http://") or files is None:
        return OTLPSpanExporter(endpoint=address, insecure=True, timeout=EXPORT_TIMEOUT_S)
    creds = grpc.ssl_channel_credentials(root_certificates=files.ca, private_key=files.key,
                                         certificate_chain=files.cert)
    return OTLPSpanExporter(endpoint=address, credentials=creds, timeout=EXPORT_TIMEOUT_S, channel_options=(
        ("grpc.ssl_target_name_override", contract.server_name(COLLECTOR_SERVICE)),))


class _Background(SpanExporter):
    """`exporter`, its batch processor's export thread lowered to EXPORT_NICE the first
    time it exports (Linux nice values are per thread; a flush from another thread, e.g.
    at shutdown, keeps that thread's priority)."""

    def __init__(self, exporter: SpanExporter) -> None:
        self._exporter = exporter
        self._lowered: set[int] = set()

    def export(self, spans):
        me = threading.current_thread()
        if EXPORT_NICE and me.name.startswith("OtelBatch") and me.native_id not in self._lowered:
            self._lowered.add(me.native_id)
            try:
                os.setpriority(os.PRIO_PROCESS, me.native_id, EXPORT_NICE)
            except (OSError, AttributeError) as exc:  # not Linux, or not allowed: export as it is
                log.debug("span export thread keeps its priority: %s", exc)
        return self._exporter.export(spans)

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


class _InjectOnlyBaggage(W3CBaggagePropagator):
    """Baggage sent on, never taken in (the router's: clients do not name our attributes)."""

    def extract(self, carrier, context=None, getter=None):
        return context if context is not None else otel_context.get_current()


def configure(service: str, instance_id: str, environ: Mapping[str, str] | None = None,
              exporter=None, files=None, trust_baggage: bool = True) -> TracerProvider | None:
    """Install this process's tracer provider; None (and the API's no-op tracer) when no
    endpoint is configured and no `exporter` given (tests pass one). `files`: this
    process's TlsFiles, for mutual TLS to the collector. `trust_baggage` False (the
    router): incoming baggage is ignored."""
    global _provider
    url = endpoint(environ)
    if exporter is None and not url:
        return None
    exporter = exporter or exporter_for(url, files, environ)
    provider = TracerProvider(resource=Resource.create({
        "service.name": f"pdserve-{service}", "service.instance.id": instance_id}))
    provider.add_span_processor(BaggageSpanProcessor(lambda key: key.startswith("pd.")))
    provider.add_span_processor(BatchSpanProcessor(_Background(exporter), max_queue_size=MAX_QUEUE_SPANS,
                                                   export_timeout_millis=int(EXPORT_TIMEOUT_S * 1000)))
    if not isinstance(trace.get_tracer_provider(), TracerProvider):  # the API allows one per process
        trace.set_tracer_provider(provider)
    global _tracer
    _tracer = provider.get_tracer("pdserve")
    propagate.set_global_textmap(CompositePropagator([
        TraceContextTextMapPropagator(), W3CBaggagePropagator() if trust_baggage else _InjectOnlyBaggage()]))
    _provider = provider
    return provider


def shutdown() -> None:
    """Flush what is queued (bounded by the export timeout) and stop exporting."""
    global _provider, _tracer
    if _provider is not None:
        _provider.shutdown()
        _provider, _tracer = None, trace.NoOpTracer()


def tracer() -> trace.Tracer:
    """pdserve's tracer (the no-op one while tracing is off)."""
    return _tracer


@contextlib.contextmanager
def span_in(name: str, context=None, attributes: Mapping | None = None) -> Iterator[trace.Span]:
    """A live span `name` as the current one, under `context` (default: the current one;
    given, it is attached for the block so calls made inside carry its baggage too)."""
    if _provider is None:
        yield trace.INVALID_SPAN
        return
    with attached(context), _tracer.start_as_current_span(name, attributes=attributes) as span:
        yield span


@contextlib.contextmanager
def attached(context) -> Iterator[None]:
    """`context` current for the block: calls made inside carry its trace and baggage (work
    outside the RPC that started it, e.g. the data plane's). None (tracing off): no-op."""
    token = otel_context.attach(context) if context is not None else None
    try:
        yield
    finally:
        if token is not None:
            otel_context.detach(token)


def past_span(name: str, start_ns: int, end_ns: int, context=None, attributes: Mapping | None = None,
              events: Iterable[tuple[str, int, Mapping]] = (), error: str = "") -> None:
    """A span for work already done: the hot path notes times (time.time_ns), the span is
    built afterwards. `events`: (name, t_ns, attributes); `error`: it failed, why."""
    if _provider is None:
        return
    span = _tracer.start_span(name, context=context, start_time=start_ns, attributes=attributes)
    for event, t_ns, attrs in events:
        span.add_event(event, attrs, timestamp=t_ns)
    if error:
        failed(span, error)
    span.end(end_time=max(end_ns, start_ns))


def event(name: str, attributes: Mapping | None = None) -> None:
    """An event on the current span (nothing while tracing is off or none is current)."""
    if _provider is not None:
        trace.get_current_span().add_event(name, attributes)


def failed(span: trace.Span, reason: str) -> str:
    """Mark `span` failed with `reason` (an ERROR status and an event naming it); returns
    `reason` (so a caller can `return failed(span, why)`)."""
    if reason and span.is_recording():
        span.set_status(trace.Status(trace.StatusCode.ERROR, reason))
        span.add_event("error", {"pd.reason": reason})
    return reason


def current_context():
    """The current context (kept by work that outlives its RPC; None while tracing is off)."""
    return otel_context.get_current() if _provider is not None else None


def with_request(attributes: Mapping[str, str | int], context=None):
    """`context` (default: the current one) with `attributes` as pd.* baggage, replacing
    whatever baggage it had: every span started under it, here or downstream, carries them."""
    ctx = baggage.clear(context)
    for key, value in attributes.items():
        ctx = baggage.set_baggage(key, str(value), ctx)
    return ctx


def inject(carrier: dict | None = None, context=None) -> dict:
    """`context` (default: the current one) as W3C headers (for the data plane's commit)."""
    carrier = {} if carrier is None else carrier
    if _provider is not None:
        propagate.inject(carrier, context=context)
    return carrier


def extract(carrier: Mapping[str, str]):
    """A context from W3C headers (a span started with it joins the sender's trace); None
    while tracing is off or when there are none."""
    return propagate.extract(dict(carrier)) if _provider is not None and carrier else None


def server_interceptors() -> list:
    """The asyncio server interceptors that open a SERVER span per call, a child of the
    caller's context from the metadata (none while off; health checks and heartbeats are
    not traced)."""
    return [] if _provider is None else [_ServerSpans()]


class _ServerSpans(grpc.aio.ServerInterceptor):
    """One SERVER span per call named after its method, under the caller's W3C context.

    Why not the OpenTelemetry gRPC instrumentation's aio interceptor: it wraps a streaming
    handler's generator in its own and does not close it when the call ends, so a client's
    cancel reached our handler only when the garbage collector finalized it — seconds
    later, with the decode worker still decoding and holding blocks
    (tests/e2e/test_e2e_bad_input.py caught it). This one closes it at once (aclosing)."""

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        method = details.method
        if handler is None or method.startswith("/grpc.health.") or method.endswith(UNTRACED_METHODS):
            return handler
        metadata = details.invocation_metadata
        attributes = {"rpc.system": "grpc", "rpc.method": method}

        def remote():
            return propagate.extract({m.key: m.value for m in metadata or ()})

        if handler.unary_unary is not None or handler.stream_unary is not None:
            inner = handler.unary_unary or handler.stream_unary

            async def unary(request, context):  # a request, or a stream-unary call's requests
                token = otel_context.attach(remote())  # the caller's baggage, for our own calls
                try:
                    with _tracer.start_as_current_span(method, kind=trace.SpanKind.SERVER, attributes=attributes):
                        return await inner(request, context)
                finally:
                    otel_context.detach(token)

            if handler.unary_unary is not None:
                return handler._replace(unary_unary=unary)
            return handler._replace(stream_unary=unary)
        if handler.unary_stream is not None or handler.stream_stream is not None:
            kind = "unary_stream" if handler.unary_stream is not None else "stream_stream"
            inner_stream = getattr(handler, kind)

            async def stream(request, context):  # a request, or a stream-stream call's requests
                parent = remote()
                span = _tracer.start_span(method, context=parent, kind=trace.SpanKind.SERVER, attributes=attributes)
                ctx = trace.set_span_in_context(span, parent)
                items = inner_stream(request, context)
                try:
                    while True:
                        # The context is attached around each step, not across a yield: the
                        # stream may be resumed, or closed, from another task.
                        token = otel_context.attach(ctx)
                        try:
                            item = await anext(items)
                        except StopAsyncIteration:
                            break
                        finally:
                            otel_context.detach(token)
                        yield item
                except (GeneratorExit, asyncio.CancelledError):
                    raise
                except BaseException as exc:
                    failed(span, f"{type(exc).__name__}: {exc}")
                    raise
                finally:
                    await items.aclose()  # the handler's own cleanup runs now, not at collection
                    span.end()

            return handler._replace(**{kind: stream})
        return handler


UNTRACED_METHODS = ("/Heartbeat",)
"""Calls that are no request's: lease heartbeats (one a second per worker would bury the
requests' traces); health checks are left out too."""


def carrying_context(channel: grpc.aio.Channel) -> grpc.aio.Channel:
    """`channel`, its calls sending the current trace context (W3C traceparent and baggage
    metadata); the channel itself while tracing is off.

    They open no span of their own: the callee's server span is the call's span, a child
    of the caller's current one. A client span per call as well (the OpenTelemetry gRPC
    instrumentation's client interceptor) measured ~190 µs per call here and doubled the
    spans of a hand-off for the same information (bench/results/tracing.md). Nor is this a
    grpc.aio client interceptor: an intercepted call runs its interceptor in a task of its
    own around a second call object (bench/tracing.py `call_cost`); this adds the metadata in
    the caller's frame and hands gRPC the call as it is."""
    return channel if _provider is None else _ContextChannel(channel)


class _ContextChannel:
    """A grpc.aio channel whose multicallables add the current context to each call."""

    __slots__ = ("_channel",)

    def __init__(self, channel: grpc.aio.Channel):
        self._channel = channel

    def __getattr__(self, name: str):  # close, channel_ready, get_state, ...
        return getattr(self._channel, name)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return await self._channel.__aexit__(*exc)

    def unary_unary(self, *args, **kwargs):
        return _WithContext(self._channel.unary_unary(*args, **kwargs))

    def unary_stream(self, *args, **kwargs):
        return _WithContext(self._channel.unary_stream(*args, **kwargs))

    def stream_unary(self, *args, **kwargs):
        return _WithContext(self._channel.stream_unary(*args, **kwargs))

    def stream_stream(self, *args, **kwargs):
        return _WithContext(self._channel.stream_stream(*args, **kwargs))


class _WithContext:
    """A multicallable whose calls carry the current context in their metadata."""

    __slots__ = ("_call",)

    def __init__(self, call):
        self._call = call

    def __call__(self, *args, metadata=None, **kwargs):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if carrier:
            metadata = grpc.aio.Metadata(*tuple(metadata or ()), *carrier.items())
        return self._call(*args, metadata=metadata, **kwargs)
