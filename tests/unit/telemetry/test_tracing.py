"""Tracing setup and the local collector (docs/observability.md): spans reach the collector over real
OTLP/gRPC with mutual TLS, only pdserve's services may export, pd.* baggage lands on
every span (never a client's at the router), a dead collector costs dropped spans and
no time, and the data plane's commit carries the context within bounds."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import grpc
import pytest
from opentelemetry import baggage, trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from pdserve_client.rpc.pd.v1 import common_pb2, prefill_pb2, prefill_pb2_grpc
from pdserve_client.tls import credentials
from runtime.telemetry import collector, tracing
from runtime.transfer.base import TransferCommit
from runtime.transfer.tcp.wire import decode_commit, encode_commit
from tests.support import pki


@pytest.fixture(autouse=True)
def _tracing_off_after():
    yield
    tracing.shutdown()  # configure() is process-wide: the next test starts with tracing off


async def _collector(tmp_path, security=None):
    out = tmp_path / "spans.jsonl"
    server, port, _ = await collector.start("127.0.0.1:0", out, security)
    return server, port, out


def test_tracing_is_off_without_an_endpoint():
    assert tracing.endpoint({}) == "" and tracing.configure("router", "r", environ={}) is None
    assert not tracing.enabled() and tracing.server_interceptors() == [] and tracing.inject() == {}
    assert tracing.endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": " http://h:4317 "}) == "http://h:4317"
    both = {"OTEL_EXPORTER_OTLP_ENDPOINT": "a:1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "b:2"}
    assert tracing.endpoint(both) == "b:2"


def test_spans_reach_the_collector_over_mutual_tls_with_their_request_baggage(tmp_path):
    async def go():
        server, port, out = await _collector(tmp_path, pki.security("collector", "collector"))
        try:
            provider = tracing.configure("decode", "decode-0", environ={
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"127.0.0.1:{port}"}, files=pki.files("decode", "decode-0"))
            ctx = tracing.with_request({"pd.request_id": "r1", "pd.tenant": "t"})
            with tracing.span_in("request", ctx):
                carrier = tracing.inject()
            with tracing.span_in("validate", tracing.extract(carrier), {"x": 1}):
                pass
            tracing.past_span("compute", time.time_ns() - 1000, time.time_ns(), error="boom")
            assert await asyncio.to_thread(provider.force_flush, 5000)
        finally:
            await server.stop(0)
        return collector.read(out)

    by_name = {s["name"]: s for s in asyncio.run(go())}
    assert by_name["request"]["attributes"] == {"pd.request_id": "r1", "pd.tenant": "t"}
    assert by_name["request"]["service"] == "pdserve-decode" and by_name["request"]["instance"] == "decode-0"
    assert by_name["validate"]["trace_id"] == by_name["request"]["trace_id"]  # joined by the carrier
    assert by_name["validate"]["parent_id"] == by_name["request"]["span_id"]
    assert by_name["validate"]["attributes"] == {"pd.request_id": "r1", "pd.tenant": "t", "x": 1}  # baggage came along
    assert by_name["compute"]["status"] == 2 and by_name["compute"]["status_message"] == "boom"


@pytest.mark.parametrize("role,name", [("client", "tenant-a"), ("operator", "operator")])
def test_only_pdserve_services_may_export_to_the_collector(tmp_path, role, name):
    async def go():
        server, port, out = await _collector(tmp_path, pki.security("collector", "collector"))
        try:
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials(pki.files(role, name)), options=[
                    ("grpc.ssl_target_name_override", "collector.pdserve.internal")]) as ch:
                stub = trace_service_pb2_grpc.TraceServiceStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Export(trace_service_pb2.ExportTraceServiceRequest(), timeout=5)
        finally:
            await server.stop(0)
        return err.value, out

    err, out = asyncio.run(go())
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and f"{role}/{name}" in err.details()
    assert not out.exists()


def test_the_router_never_takes_a_clients_baggage():
    tracing.configure("router", "router", exporter=OTLPSpanExporter(endpoint="127.0.0.1:9", insecure=True),
                      trust_baggage=False)
    claimed = tracing.extract({"traceparent": "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01",
                               "baggage": "pd.request_id=someone-else,pd.tenant=victim"})
    assert trace.get_current_span(claimed).get_span_context().trace_id == 0x0123456789ABCDEF0123456789ABCDEF
    assert baggage.get_all(claimed) == {}  # the trace is joined, the identity is not taken


def test_a_dead_collector_costs_no_time():
    provider = tracing.configure("decode", "d0", exporter=OTLPSpanExporter(
        endpoint="127.0.0.1:9", insecure=True, timeout=1))
    t0 = time.perf_counter()
    for i in range(2000):
        with tracing.span_in("s", tracing.with_request({"pd.request_id": str(i)})):
            pass
    spent = time.perf_counter() - t0
    provider.shutdown()
    assert spent < 2.0, f"2000 spans took {spent:.2f} s with the collector down"


def test_a_commit_carries_its_trace_headers_within_bounds():
    commit = TransferCommit("t/1", "t", 1, "abi", (), "d", 3, "prefill-0", 2,
                            (("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01"),))
    assert decode_commit(encode_commit(commit)) == commit
    for bad in ({"traceparent": 1}, {f"h{i}": "v" for i in range(5)}, {"baggage": "x" * 2000}, ["traceparent"]):
        wire = {**encode_commit(commit), "trace": bad}
        with pytest.raises(ValueError, match="'trace'"):
            decode_commit(wire)


class _Prefill(prefill_pb2_grpc.PrefillServicer):
    """Answers Cancel (a unary call) and Prefill (a bidirectional one) at once."""

    async def Cancel(self, request, context):
        return common_pb2.CancelResponse(request_id=request.request_id, found=True)

    async def Prefill(self, request_iterator, context):
        yield prefill_pb2.PrefillEvent(first_token=prefill_pb2.FirstToken(token_id=7))
        yield prefill_pb2.PrefillEvent(result=prefill_pb2.PrefillResult(
            request_id=str(len([r async for r in request_iterator]))))


def test_a_context_carrying_channel_joins_each_call_to_the_callers_trace():
    """The channel adds traceparent and baggage to unary and bidirectional calls alike:
    each call's server span is a child of the caller's span with its pd.* baggage; off,
    the channel is the plain one."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    plain = object()
    assert tracing.carrying_context(plain) is plain  # tracing off: nothing wraps

    async def go(exporter):
        server = grpc.aio.server(interceptors=tracing.server_interceptors())
        prefill_pb2_grpc.add_PrefillServicer_to_server(_Prefill(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with tracing.carrying_context(grpc.aio.insecure_channel(f"127.0.0.1:{port}")) as channel:
                stub = prefill_pb2_grpc.PrefillStub(channel)
                with tracing.span_in("caller", tracing.with_request({"pd.request_id": "r7"})):
                    await stub.Cancel(common_pb2.CancelRequest(request_id="r7"), timeout=5)
                    call = stub.Prefill(timeout=5)
                    await call.write(prefill_pb2.PrefillRequest())
                    await call.write(prefill_pb2.PrefillRequest())
                    await call.done_writing()
                    events = [e async for e in call]
                    assert events[0].first_token.token_id == 7 and events[1].result.request_id == "2"
        finally:
            await server.stop(0)

    exporter = InMemorySpanExporter()
    provider = tracing.configure("router", "r", exporter=exporter)
    asyncio.run(go(exporter))
    assert provider.force_flush(5000)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    caller = spans["caller"]
    for name in ("/pd.v1.Prefill/Cancel", "/pd.v1.Prefill/Prefill"):
        assert spans[name].parent.span_id == caller.context.span_id, name
        assert spans[name].context.trace_id == caller.context.trace_id
        assert spans[name].attributes["pd.request_id"] == "r7"


def test_the_export_thread_runs_at_a_lower_priority_and_a_flush_elsewhere_keeps_its_own(monkeypatch):
    """The batch processor's thread encodes and sends spans: it runs at EXPORT_NICE, a step
    under the request's threads; a flush from another thread (shutdown) changes nothing there."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")  # the thread exports every 20 ms
    memory = InMemorySpanExporter()
    tracing.configure("router", "r", environ={}, exporter=memory)
    with tracing.span_in("unit.one"):
        pass
    tracing._provider.force_flush()  # exported here, on this thread
    assert [s.name for s in memory.get_finished_spans()] == ["unit.one"]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0
    worker = next(t for t in threading.enumerate() if t.name.startswith("OtelBatch"))
    with tracing.span_in("unit.two"):
        pass
    deadline = time.monotonic() + 10
    while len(memory.get_finished_spans()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [s.name for s in memory.get_finished_spans()] == ["unit.one", "unit.two"]
    assert os.getpriority(os.PRIO_PROCESS, worker.native_id) == tracing.EXPORT_NICE
