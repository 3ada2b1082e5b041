"""Tracing benchmark: what OpenTelemetry tracing at 100% sampling costs (docs/observability.md).

Part 1, micro (in this process): the cost of one span (`span_cost`: started and ended
as the services do, and exported + collected), and the router's own span work for one request —
RequestTrace (router.request, baggage), router.decide with the plan's attributes, one
router.attempt, the first-token event and the end — µs per request with tracing off
(the API's no-op path, what an unconfigured router runs) and on (the SDK with a batch
processor into an in-memory exporter: the hot path only; export runs on its thread),
median of --micro-batches batches of --micro-calls requests.

Part 2, cluster: three local clusters at once (1 prefill + 1 decode, --model,
--transport, all secure): `traced` (the default: every process exports to the local
collector, parent-based always-on sampling = every span of every request),
`unsampled` (the same with OTEL_TRACES_SAMPLER=always_off: every interceptor, context
and span call in place, nothing recorded or exported — the instrumentation's share) and
`untraced` (`traces=False`: no collector, no interceptor, no provider). After --warmup requests
each, --requests disaggregated requests each (fresh random --prompt-tokens prompt,
--max-tokens, ignore_eos) go to each in turn, each cluster first in turn.
Client-side TTFT (the SDK's) per cluster: median and p90; added = median traced -
median untraced (and the median of the per-pair differences); ratio = traced /
untraced; the target is added < 3% of the untraced median. The router's decision time
(`decision_us` of its decision records, planner work only) p50 per cluster shows
whether tracing slows the decision itself (the exporter thread shares the GIL).
Each traced request's trace is checked to be whole in the collector's file.

JSON lines: {"bench": "tracing", "metric": "config" | "micro" | "ttft" | "ttft_added" |
"decision", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_ADDED_RATIO = 0.03
"""The target: tracing at 100% adds under 3% to a 16-token request's TTFT."""


def emit(**row) -> None:
    print(json.dumps({"bench": "tracing", **row}), flush=True)


def p90(xs: list[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def _router_request_work(n: int) -> float:
    """Seconds for n requests' router-side span work (whatever tracing state is current)."""
    from router.pricing.shapes import Outcome
    from router.requests.admission import Admitted
    from router.requests.attempt import Attempt
    from router.requests.planner import Plan
    from router.requests.tracing import RequestTrace
    from router.types import Completed, FinishReason, Route
    from runtime.directory.records import WorkerRecord, WorkerRole

    d = WorkerRecord("decode-0", WorkerRole.DECODE, "127.0.0.1:1")
    p = WorkerRecord("prefill-0", WorkerRole.PREFILL, "127.0.0.1:2")
    plan = Plan("disaggregated", Outcome.DISAGGREGATED, Route.DISAGGREGATED, p, d)
    done = Completed(FinishReason.LENGTH, 10.0, 1.0, 4, Route.DISAGGREGATED, 1)
    t0 = time.perf_counter()
    for i in range(n):
        req = Admitted(f"r{i}", "default", tuple(range(16)), 4, None, Route.DISAGGREGATED, None)
        tr = RequestTrace(req)
        tr.attach()
        with tr.decide() as span:
            tr.decided(span, plan)
        with tr.attempt(Attempt(1, Route.DISAGGREGATED, decode=d, prefill=p), 1, Route.DISAGGREGATED):
            tr.first_token()
        tr.ended(done)
        tr.detach()
    return time.perf_counter() - t0


def micro_part(args) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from runtime.telemetry import tracing

    def per_request_us() -> float:
        _router_request_work(args.micro_calls)  # warm
        return statistics.median(_router_request_work(args.micro_calls) / args.micro_calls * 1e6
                                 for _ in range(args.micro_batches))

    off = per_request_us()
    exporter = InMemorySpanExporter()
    tracing.configure("router", "bench", exporter=exporter, trust_baggage=False)
    try:
        on = per_request_us()
    finally:
        tracing.shutdown()
    emit(metric="micro", what="router span work per request (request, decide, attempt, end)",
         off_us=round(off, 2), on_us=round(on, 2), added_us=round(on - off, 2),
         spans_per_request=3, exported=len(exporter.get_finished_spans()))
    emit(metric="span_cost", **span_cost_us(args))
    emit(metric="call_cost", **asyncio.run(call_cost_us(args)))


async def call_cost_us(args) -> dict:
    """One unary gRPC call on loopback (client and server in this process, plaintext), µs,
    with tracing off (no interceptor) and on (the services' server interceptors and
    context-carrying channel, sampling on and off): what instrumentation adds per hop of a
    hand-off."""
    import grpc

    from pdserve_client.rpc.pd.v1 import directory_pb2, directory_pb2_grpc
    from runtime.telemetry import tracing

    class _Echo(directory_pb2_grpc.DirectoryServicer):
        """Answers GetRouteEpoch at once: the call's cost is all gRPC."""

        async def GetRouteEpoch(self, request, context):
            return directory_pb2.RouteEpochResponse(route_epoch=1)

    async def per_call() -> float:
        server = grpc.aio.server(interceptors=tracing.server_interceptors())
        directory_pb2_grpc.add_DirectoryServicer_to_server(_Echo(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = tracing.carrying_context(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        stub, request = directory_pb2_grpc.DirectoryStub(channel), directory_pb2.GetRouteEpochRequest()
        calls = max(100, args.micro_calls // 4)
        try:
            with tracing.span_in("bench.caller"):  # a current span, as in a request
                times = []
                for _ in range(args.micro_batches + 1):
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        await stub.GetRouteEpoch(request)
                    times.append((time.perf_counter() - t0) / calls * 1e6)
        finally:
            await channel.close()
            await server.stop(0)
        return statistics.median(times[1:])

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    off = await per_call()
    out = {"off_us": round(off, 1)}
    for name, sampler in (("on_us", "parentbased_always_on"), ("unsampled_us", "parentbased_always_off")):
        os.environ["OTEL_TRACES_SAMPLER"] = sampler  # the SDK reads it from the environment
        tracing.configure("directory", "bench", exporter=InMemorySpanExporter())
        try:
            out[name] = round(await per_call(), 1)
        finally:
            tracing.shutdown()
            del os.environ["OTEL_TRACES_SAMPLER"]
    return out


def span_cost_us(args) -> dict:
    """One span started and ended the way the services do (pd.* baggage copied on, the
    batch processor), and its export: encoded as OTLP protobuf and turned into the
    collector's JSON line — µs each, median of batches. The floor of what tracing costs
    per span on this machine, whatever the instrumentation around it."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from runtime.telemetry import collector, tracing

    exporter = InMemorySpanExporter()
    tracing.configure("decode", "bench", exporter=exporter)
    ctx = tracing.with_request({"pd.request_id": "r" * 32, "pd.tenant": "default", "pd.generation": "1",
                                "pd.transfer_id": "r" * 32 + "/1", "pd.route": "disaggregated"})

    def start_end() -> float:
        t0 = time.perf_counter()
        for _ in range(args.micro_calls):
            with tracing.span_in("decode.validate", ctx):
                pass
        return (time.perf_counter() - t0) / args.micro_calls * 1e6

    try:
        start_end()
        create = statistics.median(start_end() for _ in range(args.micro_batches))
    finally:
        tracing.shutdown()  # flushes the batch into the exporter
    spans = exporter.get_finished_spans()[:args.micro_calls]
    t0 = time.perf_counter()
    wire = encode_spans(spans).SerializeToString()
    lines = collector.span_lines(trace_service_pb2.ExportTraceServiceRequest.FromString(wire))
    export = (time.perf_counter() - t0) / len(lines) * 1e6
    return {"create_end_us": round(create, 2), "export_and_collect_us": round(export, 2)}


VARIANTS = {
    "traced": (True, {}),
    "unsampled": (True, {"OTEL_TRACES_SAMPLER": "always_off"}),
    "untraced": (False, {}),
}
"""Cluster -> (ClusterSpec.traces, extra environment of its processes)."""


def cluster_part(args) -> None:
    from pdserve_client.rpc.pd.v1 import admin_pb2, admin_pb2_grpc
    from pdserve_client.spans import SPANS_FILE
    from pdserve_ops import trace_view
    from runtime.engine.presets import preset_config
    from tooling.cluster.launcher import ClusterSpec, LocalCluster

    vocab = preset_config(args.model).vocab_size
    rng = random.Random(args.seed)
    names = tuple(VARIANTS)
    clusters: dict[str, LocalCluster] = {}
    ttft: dict[str, list[float]] = {n: [] for n in names}
    router_ttft: dict[str, list[float]] = {n: [] for n in names}
    ids: dict[str, list[str]] = {n: [] for n in names}
    try:
        for name in names:
            traces, env = VARIANTS[name]
            state = tempfile.mkdtemp(prefix=f"pdserve-bench-tracing-{name}-")
            clusters[name] = LocalCluster(ClusterSpec(prefill=1, decode=1, model=args.model, transport=args.transport,
                                                      state_dir=state, traces=traces, env=env))
            clusters[name].up()
        clients = {n: c.client(timeout_s=60) for n, c in clusters.items()}
        for i in range(args.warmup + args.requests):
            for name in names[i % len(names):] + names[:i % len(names)]:  # each goes first in turn
                prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
                res = clients[name].generate_full(prompt_ids=prompt, max_tokens=args.max_tokens,
                                                  mode="disaggregated", ignore_eos=True, deadline_s=60)
                if res.route != "disaggregated" or res.attempts != 1:
                    raise RuntimeError(f"{name}: ran {res.route} after {res.attempts} attempts")
                if i >= args.warmup:
                    ttft[name].append(res.ttft_ms)
                    router_ttft[name].append(res.server_ttft_ms)
                    ids[name].append(res.request_id)
        for c in clients.values():
            c.close()

        async def decision_us(cluster) -> dict[str, float]:
            async with cluster.identity("client").aio_channel(cluster.router_address, "router") as ch:
                resp = await admin_pb2_grpc.AdminStub(ch).Decisions(admin_pb2.DecisionsRequest(limit=10_000))
            return {r.request_id: r.decision_us for r in resp.records}

        decisions = {n: asyncio.run(decision_us(c)) for n, c in clusters.items()}
        spans_file = clusters["traced"].state / SPANS_FILE
        whole, per_request = 0, []
        found, _ = trace_view.wait_for_each(spans_file, ids["traced"][-5:], wait_s=30)
        for traces in found.values():  # the last few: each one trace, no orphan
            whole += len(traces) == 1 and trace_view.waterfall(traces[0]).summary.orphans == 0
            per_request.append(sum(len(t.spans) for t in traces))
    finally:
        for c in clusters.values():
            c.down()
    for c in clusters.values():
        shutil.rmtree(c.state, ignore_errors=True)
    med = {n: statistics.median(ttft[n]) for n in names}
    for n in names:
        emit(metric="ttft", cluster=n, requests=len(ttft[n]), ttft_median_ms=round(med[n], 2),
             ttft_p90_ms=round(p90(ttft[n]), 2), router_ttft_median_ms=round(statistics.median(router_ttft[n]), 2))
    base = med["untraced"]
    added = med["traced"] - base
    paired = statistics.median(a - b for a, b in zip(ttft["traced"], ttft["untraced"], strict=True))
    emit(metric="ttft_added", prompt_tokens=args.prompt_tokens, added_ms=round(added, 2),
         added_paired_median_ms=round(paired, 2), ratio=round(med["traced"] / base, 4),
         target_ratio=1 + TARGET_ADDED_RATIO, target_added_ms=round(TARGET_ADDED_RATIO * base, 2),
         met=added < TARGET_ADDED_RATIO * base, traces_checked=5, traces_whole=whole,
         spans_per_request=statistics.median(per_request))
    emit(metric="ttft_added_unsampled", added_ms=round(med["unsampled"] - base, 2),
         ratio=round(med["unsampled"] / base, 4),
         note="every interceptor, context and span call in place, sampling off (no span recorded or exported)")
    dec = {n: [decisions[n][r] for r in ids[n] if r in decisions[n]] for n in names}
    emit(metric="decision", **{f"{n}_p50_us": round(statistics.median(dec[n]), 1) for n in names if dec[n]},
         ratio=round(statistics.median(dec["traced"]) / statistics.median(dec["untraced"]), 3)
         if dec["traced"] and dec["untraced"] else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro-calls", type=int, default=2000)
    ap.add_argument("--micro-batches", type=int, default=7)
    ap.add_argument("--requests", type=int, default=80)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=2)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--transport", default="ucx", choices=("ucx", "tcp"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-cluster", action="store_true")
    args = ap.parse_args()
    emit(metric="config", cpus=os.cpu_count(), **{k: v for k, v in vars(args).items()})
    micro_part(args)
    if not args.skip_cluster:
        cluster_part(args)


if __name__ == "__main__":
    main()
