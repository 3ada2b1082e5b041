"""OpenTelemetry tracing for every pdserve process (issue 18; work in progress).

Off unless an OTLP endpoint is configured by the standard variables
(OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; the sampler by
OTEL_TRACES_SAMPLER[_ARG], read by the SDK itself). Each process gets its own
`service.name` (pdserve-router, pdserve-prefill, ...) and `service.instance.id`
(the worker id). Spans leave through a batch processor with a bounded queue: a dead
collector costs dropped spans, never a slower request.

Context crosses gRPC by W3C `traceparent` metadata and the data plane inside the
commit (`inject` / `extract` over a plain dict carrier).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

REQUEST_ID, GENERATION, TRANSFER_ID, ROUTE, TENANT = (
    "pd.request_id", "pd.generation", "pd.transfer_id", "pd.route", "pd.tenant")
"""Span attributes every span of a request carries where they apply."""

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
MAX_QUEUE_SPANS = 8192
"""Spans waiting for export; beyond this they are dropped (and counted by the SDK)."""


def endpoint(environ: Mapping[str, str] | None = None) -> str:
    """The configured OTLP endpoint, or '' (tracing off)."""
    env = os.environ if environ is None else environ
    return next((env[v].strip() for v in ENDPOINT_VARIABLES if env.get(v, "").strip()), "")


def configure(service: str, instance_id: str, environ: Mapping[str, str] | None = None,
              exporter=None) -> TracerProvider | None:
    """Install this process's tracer provider; None (and the API's no-op tracer) when
    no endpoint is configured and no `exporter` given (tests pass an in-memory one)."""
    url = endpoint(environ)
    if exporter is None and not url:
        return None
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter(endpoint=url, insecure=url.startswith("http://"), timeout=2)
    provider = TracerProvider(resource=Resource.create({
        "service.name": f"pdserve-{service}", "service.instance.id": instance_id}))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=MAX_QUEUE_SPANS,
                                                   export_timeout_millis=2000))
    trace.set_tracer_provider(provider)
    return provider


def inject(carrier: dict | None = None) -> dict:
    """The current context as W3C headers (for the data plane's commit)."""
    carrier = {} if carrier is None else carrier
    propagate.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str]):
    """A context from W3C headers (a span started with it joins the sender's trace)."""
    return propagate.extract(dict(carrier))
