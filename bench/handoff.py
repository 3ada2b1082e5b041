"""Hand-off critical-path benchmark (docs/benchmarks.md, Hand-off): what a disaggregated
request pays over a colocated one on a short prompt, hop by hop.

One local cluster (--model, --transport, 1 prefill + 1 decode, secure, traced: the
default deployment; --no-secure and --no-traces measure what each costs, the latter
without the waterfall). After --warmup requests per mode, --requests pairs: a colocated
and a disaggregated request (which goes first alternates), each on a fresh random
--prompt-tokens prompt (none the cluster's prefix cache holds), --max-tokens, ignore_eos,
one at a time. Client-side TTFT (the SDK's) per mode: median and p90; overhead = median
disaggregated - median colocated (the target: <= 5 ms),
ratio = disaggregated / colocated, both from this run.

Token 0 of a disaggregated request leaves from the prefill as soon as it is sampled (the
router streams it while the hand-off goes on): the hand-off is on the way to token 1. The
`token_1` rows give the client-side time to token 1 per mode and `handoff_overhead_ms`,
disaggregated - colocated (both computed token 1 by one decode step: the difference is
the hand-off's and its hops'). The floor, the design floor, the legs and the
`handoff_path` row are that hand-off's; the `path` row is token 0's way.

Per-hop breakdown, from each request's trace in the collector's file: for every span name
(service / name) of the disaggregated requests, the median start offset from the client's
request span (the router's Generate span) and the median duration, in critical-path order,
with the colocated requests' figures beside it where the span exists there too. Spans
overlap (a parent covers its children): read the offsets as a waterfall.

The floor, in the same run: the median round trip of one gRPC call (grpc.health.v1 Check,
mutual TLS, from this process) to the directory, the decode and the prefill worker, and
the round trips a disaggregated request makes in sequence that a colocated one does not
(`EXTRA_ROUND_TRIPS`): their product is what the hand-off's protocol costs on this machine
however little work each hop does, against `handoff_overhead_ms`.

The work, in the same run: the CPU time (user + system, all threads) every cluster
process spends per request, over `--requests` requests of each mode in a row. On a
machine where every process shares two cores, the extra CPU of a disaggregated request
is time on the critical path unless it overlaps compute; where the overhead is close to
it, the overhead is work (Python per hop: gRPC, TLS, protobuf, spans), not waiting.
`overhead_if_cores_saturated_ms` is that extra CPU spread over every core this process may
use: the overhead it forces when nothing of it overlaps anything else's idle time.

What the calls themselves cost, in the same run: the CPU (nanosecond scheduler counters,
every thread) one bare health check costs the server and this client; times the calls
only a disaggregated request makes (`EXTRA_CALLS`) it is the least CPU the transaction's
contract costs here (`call_cpu_floor`), and its share of the measured extra CPU says how
much of that is the calls' number and how much the work behind each (handlers, spans,
Redis, UCX).

The legs, in the same run, from the traces (read by bench/_handoff_traces.py): the time the
hand-off spends between processes (`EXTRA_LEGS`: five one-way hops a colocated request does
not make; `shared_legs`: token 0's two, which it makes too), from the last traced step of
one process to the first of the next — a message in flight, the receiver waking up, and
its gRPC, TLS and interceptor machinery before its first traced line. Against
`one_way_idle_ms` (half the idle round trip), their sum says how much of the hand-off is
hops under load before any handler work.

The design floor, in the same run, after the cluster is down (bench/_handoff_floor.py):
the same hops in skeleton processes on the same cores (grpc.aio, pdserve's UCX runtime,
Redis with Lua compare-and-sets; with --secure, mutual TLS and the decode's call that
consumes the capability's nonce in Redis, as the design's contract has it) with no work in
them (no spans, no signatures, no checks, no model: a calibrated GIL-free compute burst of
--floor-compute-ms), alternating pairs as above, its token 0 sent once the decode published
(as the decode's tokens wait for publication). Its overhead is what this design's hand-off
hops cost on this machine, waking one process after another; `pdserve_over_floor_ms` is
pdserve's own work on top of them (`handoff_overhead_ms` - the floor's overhead).

Isolated, in the same run (`--isolated-gap-ms`, 0 to skip): as many pairs again, each
request after a pause long enough for the previous one's tail (the decode's Release, the
prefill's reply, span exports) to end. Back to back, that tail shares the two cores with
the next request's path, a colocated request's being shorter and lighter; `tail_ms` (the
back-to-back overhead minus the isolated one) is what it costs the overhead. A measure of
where the overhead comes from, not of the target: the target's overhead is the
back-to-back one, as a loaded server runs.

Whose CPU the path spends, in the same run (`--sched-requests` pairs more, 0 to skip; needs
the traces and `perf`, else a row says why): the kernel's scheduler trace over those
requests (bench/_handoff_sched.py), each request cut at its traced steps (the `path` row's
after the compute, and the compute and what comes before it). Per segment: the wall time,
the CPU each process spent in it (its event loop apart from its other threads), the time the
cluster's threads waited for a CPU while one was free (a wake-up's latency, or a thread
queued behind the one that woke it) and while every one was busy (contention), and the
CPUs' idle time. `path_cpu_extra` is the whole path's disaggregated minus colocated figures:
where the cluster's extra CPU on the path and the waits behind it account for the overhead,
the overhead is that work on these cores, and what would remove it is less of it.

JSON lines: {"bench": "handoff", "metric": "config" | "ttft" | "overhead" | "token_1" | "handoff" |
"overhead_isolated" | "round_trip" | "floor" | "design_floor" | "cpu" | "cpu_extra" | "call_cpu_floor" | "legs" |
"path" | "handoff_path" | "held" | "calls" | "spans" | "path_cpu" | "path_cpu_extra" | "hop", ...}; "held":
how long the decode's tokens waited at the router for the prefill's digest, in the traces
where they did (`HELD_LEG`); "calls" counts
the gRPC calls each process served per traced request (mean, asked-again ones included);
"spans" the spans each process made per traced request and the events on them (what a
request's trace costs to make, export and keep);
"hop" rows include the
spans' events ("service/span@event", duration 0: the router's first_token is when token 0
left for the client, the prefill's Prefill call's when it left the prefill).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._handoff_floor import cpu_s, overheads
from bench._handoff_traces import hops, trace_rows

TARGET_OVERHEAD_MS = 5.0
"""Disaggregated - colocated median TTFT on a 16-token prompt, at most (docs/benchmarks.md, Hand-off)."""
MODES = ("colocated", "disaggregated")
EXTRA_ROUND_TRIPS = {
    "router -> decode Reserve": 1.0,
    "prefill -> decode COMMIT (one way: the decode's tokens leave once published)": 0.5,
    "decode -> directory Publish (validated and published in one call)": 1.0,
}
"""What the hand-off (the way to a disaggregated request's token 1) waits on, in sequence,
that a colocated request does not, in round trips (the directory's Reserve, the AUTH and
the decode's nonce check overlap the prefill's compute; the source declares under its seal
inside the COMMIT, no Begin; the prefill's reply to the router trails the verdict, off
the path). The decode's Reserve
overlaps the prefill's compute too (the job leaves beside it, the grant after), but only
where the compute has a core of its own: counted whole here, where it has not."""
EXTRA_CALLS = {
    "router -> decode Reserve": 1, "router -> directory Reserve": 1, "router -> prefill Prefill": 1,
    "decode -> directory ConsumeNonce": 1, "decode -> directory Publish": 1, "decode -> directory Release": 1,
}
"""The gRPC calls a disaggregated request makes that a colocated one does not (DecodeStream
takes Generate's place): the transaction's contract (reserve, the nonce, the compare-and-set
with the source's sealed declaration, the release), each at least one call's CPU."""
RTT_CALLS = 50
FLOOR_STEP_MS = 0.3
"""The design floor's decode step (token 1; after the TTFT either way)."""
def emit(**row) -> None:
    print(json.dumps({"bench": "handoff", **row}), flush=True)


def p90(xs: list[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def cpu_per_request(cluster, sdk, mode: str, args, rng, vocab: int) -> dict[str, float]:
    """CPU ms (user + system, every thread) each cluster process spent per request over
    `args.requests` requests of `mode` in a row (the client's own process excluded)."""
    pids = {name: p.pid for name, p in cluster.procs.items()}

    def times() -> dict[str, float]:
        return {name: cpu_s(pid) for name, pid in pids.items()}
    before = times()
    for _ in range(args.requests):
        prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
        res = sdk.generate_full(prompt_ids=prompt, max_tokens=args.max_tokens, mode=mode, ignore_eos=True,
                                deadline_s=60)
        if res.route != mode:
            raise RuntimeError(f"{mode}: ran {res.route}")
    after = times()
    return {name: (after[name] - before[name]) * 1000 / args.requests for name in pids}


def round_trips(cluster, name: str, service: str, secure: bool) -> tuple[list[float], float, float]:
    """RTT_CALLS health Checks (ms) on one channel (mutual TLS when `secure`) to process
    `name`, after one untimed call (the handshake); with the CPU ms per call they cost the
    server process and this one (health checks are untraced: the least a call costs here)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from pdserve_client import tls
    out = []
    address = cluster.procs[name].address
    server = cluster.procs[name].pid
    with tls.channel(address, cluster.client_files("operator"), service) if secure else \
            grpc.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for i in range(RTT_CALLS + 1):
            if i == 1:
                server_cpu, client_cpu = cpu_s(server), time.process_time()
            t0 = time.perf_counter()
            stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10, wait_for_ready=True)
            if i:
                out.append((time.perf_counter() - t0) * 1000)
        server_cpu = (cpu_s(server) - server_cpu) * 1000 / RTT_CALLS
        client_cpu = (time.process_time() - client_cpu) * 1000 / RTT_CALLS
    return out, server_cpu, client_cpu


def run(args) -> None:
    from bench import _handoff_sched as sched
    from bench._handoff_floor import measure as measure_floor
    from pdserve_client.spans import SPANS_FILE
    from pdserve_ops import trace_view
    from runtime.engine.presets import preset_config
    from tooling.cluster.launcher import ClusterSpec, LocalCluster

    vocab = preset_config(args.model).vocab_size
    rng = random.Random(args.seed)
    emit(metric="config", model=args.model, transport=args.transport, prompt_tokens=args.prompt_tokens,
         max_tokens=args.max_tokens, requests=args.requests, warmup=args.warmup, seed=args.seed,
         secure=args.secure, traces=args.traces, isolated_gap_ms=args.isolated_gap_ms)
    state = tempfile.mkdtemp(prefix="pdserve-bench-handoff-")
    if not args.secure:  # the SDK's plaintext switch (else it looks for a certificate)
        from pdserve_client import contract
        os.environ[contract.INSECURE_ENV] = "1"
    cluster = LocalCluster(ClusterSpec(prefill=1, decode=1, model=args.model, transport=args.transport,
                                       state_dir=state, insecure=not args.secure, traces=args.traces))
    ttft: dict[str, list[float]] = {m: [] for m in MODES}
    token_1: dict[str, list[float]] = {m: [] for m in MODES}
    ids: dict[str, list[str]] = {m: [] for m in MODES}
    isolated: dict[str, list[float]] = {m: [] for m in MODES}
    sched_ids: dict[str, list[str]] = {m: [] for m in MODES}
    sched_why = ("skipped (--sched-requests 0)" if args.sched_requests <= 0 else
                 "needs the traces (--no-traces)" if not args.traces else sched.unavailable())
    recording = None
    try:
        cluster.up()
        with cluster.client(timeout_s=60) as sdk:
            def pairs(n: int, gap_s: float = 0.0):
                """n pairs, one request per mode (which goes first alternates), each on a
                fresh prompt: the same prompt twice would find the first one's blocks in
                the decode's prefix cache from its second block on (a 16-token prompt has
                none to reuse; a long one would skip most of its compute);
                (pair, mode, result); `gap_s` paused before each request."""
                for i in range(n):
                    for mode in MODES if i % 2 else MODES[::-1]:
                        prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
                        if gap_s:
                            time.sleep(gap_s)  # the last request's tail ends meanwhile
                        res = sdk.generate_full(prompt_ids=prompt, max_tokens=args.max_tokens, mode=mode,
                                                ignore_eos=True, deadline_s=60)
                        if res.route != mode or res.attempts != 1:
                            raise RuntimeError(f"{mode}: ran {res.route} after {res.attempts} attempts")
                        yield i, mode, res

            for i, mode, res in pairs(args.warmup + args.requests):
                if i >= args.warmup:
                    ttft[mode].append(res.ttft_ms)
                    token_1[mode].extend(res.token_times_ms[1:2])
                    ids[mode].append(res.request_id)
            for _, mode, res in pairs(args.requests if args.isolated_gap_ms > 0 else 0, args.isolated_gap_ms / 1000):
                isolated[mode].append(res.ttft_ms)
            if sched_why == "":
                with sched.Recording(Path(state) / "sched.data") as recording:
                    for _, mode, res in pairs(args.sched_requests):
                        sched_ids[mode].append(res.request_id)
            cpu = {mode: cpu_per_request(cluster, sdk, mode, args, rng, vocab) for mode in MODES}
        calls = {svc: round_trips(cluster, name, svc, args.secure) for svc, name in
                 (("directory", "directory"), ("decode", "decode-0"), ("prefill", "prefill-0"))}
        rtts = {svc: c[0] for svc, c in calls.items()}
        spans_file = cluster.state / SPANS_FILE
        traces = {m: [] for m in MODES}
        for mode in MODES if args.traces else ():
            found, _ = trace_view.wait_for_each(spans_file, ids[mode], wait_s=30)
            traces[mode] = [t[0] for t in found.values() if len(t) == 1]
        path_rows = {}
        if recording is not None:
            try:
                timeline = sched.Timeline(recording.runs(), os.cpu_count() or 1)  # perf saw every CPU
            except subprocess.SubprocessError as e:
                sched_why = f"perf sched timehist failed: {e}"
                timeline = None
            names = {p.pid: name for name, p in cluster.procs.items()}
            for mode in MODES if timeline is not None else ():
                found, _ = trace_view.wait_for_each(spans_file, sched_ids[mode], wait_s=30)
                segments = sched.path_cpu(timeline, [t[0] for t in found.values() if len(t) == 1], mode,
                                          recording.offset_ns, names)
                if segments:  # no trace holding every step: no row for the mode
                    path_rows[mode] = segments
    finally:
        cluster.down()
    shutil.rmtree(state, ignore_errors=True)
    cfg = preset_config(args.model)
    # K and V of every layer for the prompt, float32 (the cluster's default PD_DTYPE)
    kv_bytes = 2 * cfg.num_hidden_layers * args.prompt_tokens * cfg.num_key_value_heads * cfg.head_dim * 4
    floor_run = measure_floor(args.requests, args.warmup, args.floor_compute_ms, FLOOR_STEP_MS, kv_bytes,
                              tls=args.secure, nonce=args.secure)

    med, overhead, paired = overheads(ttft)
    for m in MODES:
        emit(metric="ttft", mode=m, requests=len(ttft[m]), ttft_median_ms=round(med[m], 2),
             ttft_p90_ms=round(p90(ttft[m]), 2))
    emit(metric="overhead", prompt_tokens=args.prompt_tokens, overhead_ms=round(overhead, 2),
         overhead_paired_median_ms=round(paired, 2), ratio=round(med["disaggregated"] / med["colocated"], 3),
         target_ms=TARGET_OVERHEAD_MS, met=overhead <= TARGET_OVERHEAD_MS,
         traces=len(traces["disaggregated"]))
    handoff = None
    if all(len(token_1[m]) == len(ttft[m]) for m in MODES) and token_1["disaggregated"]:
        t1_med, handoff, t1_paired = overheads(token_1)
        for m in MODES:
            emit(metric="token_1", mode=m, requests=len(token_1[m]), token_1_median_ms=round(t1_med[m], 2),
                 token_1_p90_ms=round(p90(token_1[m]), 2))
        emit(metric="handoff", what="time to token 1, disaggregated - colocated: the hand-off (token 0 left "
                                    "from the prefill before it ended)", handoff_overhead_ms=round(handoff, 2),
             handoff_overhead_paired_median_ms=round(t1_paired, 2), ttft_overhead_ms=round(overhead, 2))
    if isolated["disaggregated"]:
        iso_med, iso_over, iso_paired = overheads(isolated)
        emit(metric="overhead_isolated", gap_ms=args.isolated_gap_ms, requests=len(isolated["disaggregated"]),
             colocated_ttft_median_ms=round(iso_med["colocated"], 2),
             disaggregated_ttft_median_ms=round(iso_med["disaggregated"], 2), overhead_ms=round(iso_over, 2),
             overhead_paired_median_ms=round(iso_paired, 2), back_to_back_overhead_ms=round(overhead, 2),
             tail_ms=round(overhead - iso_over, 2))  # a cause's measure, not the target's (see the docstring)
    for svc, (ms, server_cpu, client_cpu) in calls.items():
        emit(metric="round_trip", service=svc, calls=len(ms), rtt_median_ms=round(statistics.median(ms), 3),
             rtt_p90_ms=round(p90(ms), 3), server_cpu_ms_per_call=round(server_cpu, 3),
             client_cpu_ms_per_call=round(client_cpu, 3))
    rtt = statistics.median([m for ms in rtts.values() for m in ms])
    floor = sum(EXTRA_ROUND_TRIPS.values()) * rtt
    emit(metric="floor", on="the hand-off (token 1)", round_trips=EXTRA_ROUND_TRIPS, rtt_median_ms=round(rtt, 3),
         floor_ms=round(floor, 2), handoff_overhead_ms=None if handoff is None else round(handoff, 2),
         handoff_over_floor=None if handoff is None else round(handoff / floor, 2))
    fl, fl_over, fl_paired = overheads(floor_run)
    emit(metric="design_floor", on="the hand-off (the skeleton's token 0 waits for publication, as the "
                                      "decode's tokens do)", compute_ms=args.floor_compute_ms, kv_bytes=kv_bytes,
         tls=args.secure, nonce_call=args.secure,
         colocated_ttft_median_ms=round(fl["colocated"], 2), disaggregated_ttft_median_ms=round(fl["disaggregated"], 2),
         floor_overhead_ms=round(fl_over, 2), floor_overhead_paired_median_ms=round(fl_paired, 2),
         handoff_overhead_ms=None if handoff is None else round(handoff, 2),
         pdserve_over_floor_ms=None if handoff is None else round(handoff - fl_over, 2),
         requests=len(floor_run["disaggregated"]),
         cpu_ms_per_request={m: round(sum(floor_run["cpu"][m].values()), 2) for m in MODES},
         extra_cpu_ms_per_request=round(sum(floor_run["cpu"]["disaggregated"].values())
                                        - sum(floor_run["cpu"]["colocated"].values()), 2),
         by_process={m: {k: round(v, 2) for k, v in sorted(floor_run["cpu"][m].items())} for m in MODES})
    for mode in MODES:
        emit(metric="cpu", mode=mode, requests=args.requests, cpu_ms_per_request=round(sum(cpu[mode].values()), 2),
             by_process={k: round(v, 2) for k, v in sorted(cpu[mode].items())})
    extra_cpu = sum(cpu["disaggregated"].values()) - sum(cpu["colocated"].values())
    cores = len(os.sched_getaffinity(0))
    emit(metric="cpu_extra", extra_cpu_ms_per_request=round(extra_cpu, 2), overhead_ms=round(overhead, 2),
         overhead_over_extra_cpu=round(overhead / extra_cpu, 2) if extra_cpu > 0 else None, cores=cores,
         overhead_if_cores_saturated_ms=round(extra_cpu / cores, 2), target_ms=TARGET_OVERHEAD_MS)
    per_call = statistics.median(server + client for _, server, client in calls.values())
    protocol_cpu = sum(EXTRA_CALLS.values()) * per_call
    emit(metric="call_cpu_floor", calls=EXTRA_CALLS, cpu_ms_per_call=round(per_call, 3),
         protocol_cpu_ms=round(protocol_cpu, 2), extra_cpu_ms_per_request=round(extra_cpu, 2),
         calls_share_of_extra_cpu=round(protocol_cpu / extra_cpu, 2) if extra_cpu > 0 else None, cores=cores,
         overhead_floor_ms=round(protocol_cpu / cores, 2))
    for row in trace_rows(traces, MODES, rtt, overhead, handoff):
        emit(**row)
    for row in sched.rows(path_rows, sched_why, overhead, args.sched_requests, TARGET_OVERHEAD_MS):
        emit(**row)
    dis, col = hops(traces["disaggregated"]), hops(traces["colocated"])
    for key, (offset, duration, n) in sorted(dis.items(), key=lambda kv: kv[1][0]):
        row = {"metric": "hop", "span": key, "start_ms": round(offset, 2), "duration_ms": round(duration, 2),
               "traces": n}
        if key in col:
            row.update(colocated_start_ms=round(col[key][0], 2), colocated_duration_ms=round(col[key][1], 2))
        emit(**row)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40,
                    help="pairs (40: a 20-pair median moved ~1 ms between runs on 2 cores)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=2)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--transport", default="ucx", choices=("ucx", "tcp"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--secure", action=argparse.BooleanOptionalAction, default=True,
                    help="mutual TLS and capabilities (the default); --no-secure: what security costs")
    ap.add_argument("--traces", action=argparse.BooleanOptionalAction, default=True,
                    help="tracing to a local collector (the default; the waterfall needs it); "
                         "--no-traces: what tracing costs")
    ap.add_argument("--isolated-gap-ms", type=float, default=50.0,
                    help="after the back-to-back pairs, as many more with this pause before each request "
                         "(the overhead on an idle cluster: the last request's tail, its Release and span "
                         "exports, done); 0: skip them")
    ap.add_argument("--floor-compute-ms", type=float, default=3.0,
                    help="the design floor's prompt compute (a GIL-free burst; between 1 and 6 ms its "
                         "overhead stayed within the run-to-run noise here)")
    ap.add_argument("--sched-requests", type=int, default=20,
                    help="after those, this many pairs more under the kernel's scheduler trace (perf sched: "
                         "the path_cpu rows, whose CPU each segment of the path spends); 0: skip them")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
