"""Tracing setup and the local collector (issue 18, work in progress): spans reach the
collector over real OTLP/gRPC; a dead collector costs dropped spans, not time."""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

from services.telemetry import collector, tracing


def test_tracing_is_off_without_an_endpoint():
    assert tracing.endpoint({}) == "" and tracing.configure("router", "r", environ={}) is None
    assert tracing.endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": " http://h:4317 "}) == "http://h:4317"


def test_spans_reach_the_local_collector_with_their_request_attributes(tmp_path):
    out = tmp_path / "spans.jsonl"
    server, port = collector.start("127.0.0.1:0", out)
    try:
        provider = tracing.configure("router", "router-0", exporter=OTLPSpanExporter(
            endpoint=f"http://127.0.0.1:{port}", insecure=True))
        tracer = provider.get_tracer("test")
        with tracer.start_as_current_span("request", attributes={tracing.REQUEST_ID: "r1"}):
            carrier = tracing.inject()
        with tracer.start_as_current_span("validate", context=tracing.extract(carrier)):
            pass
        provider.force_flush(5000)
        spans = collector.read(out)
    finally:
        server.stop(0)
    by_name = {s["name"]: s for s in spans}
    assert by_name["request"]["attributes"] == {"pd.request_id": "r1"}
    assert by_name["request"]["service"] == "pdserve-router" and by_name["request"]["instance"] == "router-0"
    assert by_name["validate"]["trace_id"] == by_name["request"]["trace_id"]  # joined by the carrier
    assert by_name["validate"]["parent_id"] == by_name["request"]["span_id"]


def test_a_dead_collector_costs_no_time():
    provider = tracing.configure("decode", "d0", exporter=OTLPSpanExporter(
        endpoint="http://127.0.0.1:9", insecure=True, timeout=1))
    tracer = provider.get_tracer("test")
    t0 = time.perf_counter()
    for i in range(2000):
        with tracer.start_as_current_span("s", attributes={tracing.REQUEST_ID: str(i)}):
            pass
    spent = time.perf_counter() - t0
    provider.shutdown()
    assert spent < 2.0, f"2000 spans took {spent:.2f} s with the collector down"
    trace.get_tracer_provider()  # the process's provider stays usable
