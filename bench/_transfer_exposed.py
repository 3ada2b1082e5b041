"""Part 2 of bench/transfer.py: how much K/V transfer a 2,048-token prompt exposes.

A real local cluster (redis, directory, 1 prefill + 1 decode worker, router;
tooling/cluster/launcher.py order), requests through the SDK, `max_tokens=2`
(TTFT is the token prefill sampled; a disaggregated max_tokens=1 request
currently fails over to colocated). The router reads PrefillResult.timings but
does not pass them on to clients, so the prefill worker is registered under a
pass-through proxy (bench/_transfer_tap.py) that records them:

  prefill_ms    compute_ms: receipt -> first token sampled (prefill alone)
  published_ms  total_ms: receipt -> the destination's verdict `published`
  exposed_ms    published_ms - queue_ms - prefill_ms: transfer not hidden behind
                compute (send tail + commit + validate/publish), up to the verdict's
                arrival back at the prefill

and, from each request's trace (the cluster exports spans to its file):

  t_exposed_ms  T_exposed as client/pdserve_client/spans.py defines it: the end of the
                last prefill compute span -> the end of decode.publish, or -> the start
                of decode.admit when the transfer was published ahead of token 0 (what
                the first token waits for; the verdict's way back, inside exposed_ms,
                is not on the client's path)

Where T_exposed goes on these cores (--exposed-sched-requests more disaggregated requests
per setting, 0 to skip; needs `perf`, else the row says why): the kernel's scheduler
trace over them (bench/_handoff_sched.py), each cut at its T_exposed window, says how long
each process's threads waited for a CPU in it, with one free and with every one busy. On
a small host the decode's loop, woken by the prefill's COMMIT, can be placed on the
prefill loop's own CPU and wait there behind it while the other CPU idles (bench/results/
transfer.md, twelfth session), and every process of the cluster shares the same cores.
`sched.t_exposed_less_loop_waits_ms` is T_exposed less the two workers' event loops'
waits for a CPU in the window (the loops that post and see the COMMIT): the part the
hand-off itself spends on hosts where each worker has its cores.

Beside them, as a cross-check: the worker's transfer_ms and the router's TTFT
(Complete.ttft_ms) of the disaggregated requests and of colocated ones on the
same cluster (the decode worker prefilling itself). One cluster per streaming
setting (layer streaming on, then off) via the worker's PD_* variable for it
(found in WorkerConfig, or --stream-env); the transport through the launcher.
Prompts are fresh random ids (no prefix-cache reuse); one untimed warm-up per
mode, then the median of --exposed-repeats. JSON lines:
{"bench": "transfer_exposed", "prompt_tokens", "mode", "prefill_ms", "published_ms", "exposed_ms"}
"""

from __future__ import annotations

import math
import os
import random
import shutil
import statistics
import subprocess
import tempfile

from _transfer_tap import PrefillTap

from bench._handoff_sched import LOOP

KV_BYTES_PER_TOKEN_LAYER_SMALL = 2 * 2 * 64 * 4  # K+V x kv heads x head_dim x fp32 (`small`)


def add_arguments(ap) -> None:
    ap.add_argument("--exposed-prompt-tokens", type=int, default=2048)
    ap.add_argument("--exposed-repeats", type=int, default=3)
    ap.add_argument("--exposed-model", default="small")
    ap.add_argument("--exposed-max-tokens", type=int, default=2,
                    help="2, not 1: a disaggregated max_tokens=1 request fails at HEAD "
                         "(prefill NOT_FOUND, router falls back to colocated)")
    ap.add_argument("--exposed-sched-requests", type=int, default=3,
                    help="disaggregated requests more per setting under the scheduler's trace (perf "
                         "sched; 0 to skip): the waits for a CPU inside each one's T_exposed")
    ap.add_argument("--exposed-transport", default="ucx",
                    help="worker transport (falls back to tcp, reported, when ucx is not built)")
    ap.add_argument("--exposed-chunk-tokens", type=int, default=0,
                    help="prefill chunk size; 0 = the launcher's default")
    ap.add_argument("--stream-env", default="",
                    help="PD_* variable switching layer streaming; default: the WorkerConfig "
                         "bool field with 'stream' in its name")


def streaming_variable(explicit: str) -> str:
    """The PD_* variable that turns layer streaming on/off, or '' if none exists yet."""
    if explicit:
        return explicit
    from runtime.worker.config import WorkerConfig
    names = [f.validation_alias for name, f in WorkerConfig.model_fields.items()
             if "stream" in name and f.annotation is bool]
    return names[0] if len(names) == 1 else ""


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def run_cluster(args, transport: str, env: dict[str, str], seed: int) -> dict[str, list]:
    """Start a cluster, time `colocated` and `disaggregated` requests alternately."""
    from runtime.engine.presets import preset_config
    from tooling.cluster.launcher import ClusterSpec, LocalCluster

    vocab = preset_config(args.exposed_model).vocab_size
    n, length = args.exposed_repeats + 1, args.exposed_prompt_tokens
    kw = dict(chunk_tokens=args.exposed_chunk_tokens) if args.exposed_chunk_tokens else {}
    state = tempfile.mkdtemp(prefix="pdserve-bench-transfer-")  # kept: logs to read on failure
    spec = ClusterSpec(prefill=1, decode=1, model=args.exposed_model, transport=transport,
                       num_blocks=8 * (length // 16), state_dir=state, env=env, **kw)
    cluster = LocalCluster(spec)
    tap = None
    try:
        cluster.start_base()
        cluster._issue("prefill-tap", "prefill")  # the tap answers the router as a prefill worker
        cluster._issue("router", "router")
        tap = PrefillTap(cluster.identity("prefill-tap"), cluster.identity("router"))
        spec.worker_env = {"prefill-0": {"PD_ADVERTISE": tap.address}}  # registered under the tap's
        cluster.start_workers()
        tap.connect(cluster.procs["prefill-0"].address)
        cluster.start_router()
        client = cluster.client(timeout_s=120)
        out: dict[str, list] = {"colocated": [], "disaggregated": []}
        for i, p in enumerate(prompts(2 * n, length, vocab, seed)):
            mode = ("colocated", "disaggregated")[i % 2]
            r = client.generate_full(prompt_ids=p, max_tokens=args.exposed_max_tokens, mode=mode,
                                     ignore_eos=True, deadline_s=300)
            if r.route != mode or r.attempts != 1:
                raise RuntimeError(f"{mode} request ran as {r.route} after {r.attempts} "
                                   f"attempts (see {cluster.state}/logs)")
            if mode == "disaggregated" and r.prefill_kv_digest != r.decode_kv_digest:
                raise RuntimeError("K/V digests differ between prefill and decode")
            if i >= 2:  # the first of each mode is the warm-up
                out[mode].append(r)
        assert len(tap.timings) == n, tap.timings
        waits = sched_waits(args, cluster, client, vocab, seed + 500)
        client.close()
        exposed = traced_exposure(cluster, out["disaggregated"])
    finally:
        cluster.down()
        if tap is not None:
            tap.close()
    shutil.rmtree(state, ignore_errors=True)  # kept only when something failed
    return {"spec": spec, "results": out, "timings": tap.timings[1:n], "t_exposed": exposed, "sched": waits}


def sched_waits(args, cluster, client, vocab: int, seed: int) -> dict:
    """`--exposed-sched-requests` disaggregated requests under `perf sched record`: each one's
    T_exposed and, inside its window, the CPU ms each process's threads ran and waited for a
    CPU, one free or every one busy ({"why": ...} when not measured)."""
    from bench import _handoff_sched as sched
    from pdserve_client.spans import SPANS_FILE
    from pdserve_ops import trace_summary, trace_view
    n = args.exposed_sched_requests
    why = "skipped (--exposed-sched-requests 0)" if n <= 0 else sched.unavailable()
    if why:
        return {"why": why}
    ids = []
    with sched.Recording(cluster.state / "sched.data") as recording:
        for p in prompts(n, args.exposed_prompt_tokens, vocab, seed):
            ids.append(client.generate_full(prompt_ids=p, max_tokens=args.exposed_max_tokens, mode="disaggregated",
                                            ignore_eos=True, deadline_s=300).request_id)
    try:
        timeline = sched.Timeline(recording.runs(), os.cpu_count() or 1)  # perf saw every CPU
    except subprocess.SubprocessError as e:
        return {"why": f"perf sched timehist failed: {e}"}
    names = {p.pid: name for name, p in cluster.procs.items()}
    found, _ = trace_view.wait_for_each(cluster.state / SPANS_FILE, ids, wait_s=30)
    out = []
    for trace in [t[0] for t in found.values() if len(t) == 1]:
        x = [e for e in trace_summary.exposures(trace) if e.t_exposed_ms is not None]
        if x:  # the window on the scheduler's clock: spans are on the wall clock
            lo, hi = (trace.start_ns + round(v * 1e6) - recording.offset_ns
                      for v in (x[-1].decode_ready_ms, x[-1].publish_end_ms))
            seg = sched.segment_cpu(timeline, lo, hi, names)
            out.append({"t_exposed_ms": x[-1].t_exposed_ms, "cpu_ms": _ms(seg.cpu),
                        "waited_core_free_ms": _ms(seg.waited_free_by),
                        "waited_cores_busy_ms": _ms(seg.waited_busy_by)})
    return {"requests": out}


def _ms(by: dict[str, int]) -> dict[str, float]:
    return {k: round(ns / 1e6, 3) for k, ns in sorted(by.items())}


def sched_summary(waits: dict, target_ms: float | None) -> dict:
    """The row's `sched` part: medians over the traced requests of T_exposed, of the decode
    loop's wait for a CPU while one was free, of both workers' loops' waits (free or busy),
    and of T_exposed less those (against the target when there is one); each request's
    figures under `runs`."""
    if "why" in waits or not waits.get("requests"):
        return {"measured": False, "why": waits.get("why", "no traced request had a T_exposed")}
    med, runs = statistics.median, waits["requests"]

    def loops(r: dict, kinds: tuple[str, ...], workers: tuple[str, ...] = ("prefill", "decode")) -> float:
        return sum(ms for kind in kinds for who, ms in r[kind].items()
                   if who.startswith(workers) and who.endswith(f"/{LOOP}"))
    both = ("waited_core_free_ms", "waited_cores_busy_ms")
    less = [max(0.0, r["t_exposed_ms"] - loops(r, both)) for r in runs]
    out = {"measured": True, "requests": len(runs), "t_exposed_ms": round(med(r["t_exposed_ms"] for r in runs), 3),
           "decode_loop_waited_core_free_ms": round(med(loops(r, both[:1], ("decode",)) for r in runs), 3),
           "loops_waited_ms": round(med(loops(r, both) for r in runs), 3),
           "t_exposed_less_loop_waits_ms": round(med(less), 3), "runs": runs}
    if target_ms is not None:
        out["less_waits_met"] = out["t_exposed_less_loop_waits_ms"] <= target_ms
    return out


def traced_exposure(cluster, results) -> list[float]:
    """T_exposed (ms) of each request that has a whole trace with one (spans.py's definition)."""
    from pdserve_client.spans import SPANS_FILE
    from pdserve_ops import trace_summary, trace_view
    found, _ = trace_view.wait_for_each(cluster.state / SPANS_FILE, [r.request_id for r in results], wait_s=30)
    exposed = [trace_summary.summarize(t[0]).t_exposed_ms for t in found.values() if len(t) == 1]
    return [t for t in exposed if t is not None]


def one_layer_ms(bandwidth: dict, transport: str, kv_bytes: int, layer_bytes: int) -> float | None:
    """One layer's transfer time at the part-1 bandwidth of pdserve-<transport>, taken at
    the measured size nearest the prompt's whole K/V (by ratio), and only within 2x of it:
    a 1 MiB rate says nothing of a 16 MiB prompt's (None: no such size measured)."""
    sizes = [s for s, paths in bandwidth.items() if f"pdserve-{transport}" in paths]
    near = min(sizes, key=lambda s: abs(math.log(s * (1 << 20) / kv_bytes)), default=None)
    if near is None or not 0.5 <= near * (1 << 20) / kv_bytes <= 2:
        return None
    return layer_bytes / (bandwidth[near][f"pdserve-{transport}"] * 1e9) * 1000


def exposed_part(args, emit, bandwidth: dict | None = None) -> None:
    """Emit the transfer_exposed lines (see the module docstring); `bandwidth` is part 1's
    {size_mib: {path: gbps}}, for the one-layer estimate the target is stated in."""
    from runtime.transfer import factory
    transport = args.exposed_transport
    if transport not in factory.SENDERS:
        emit(bench="transfer_exposed", note=f"transport {transport!r} not built yet; using tcp")
        transport = "tcp"
    var = streaming_variable(args.stream_env)
    settings = [("disaggregated-streaming", {var: "1"}), ("disaggregated-no-streaming", {var: "0"})]
    if not var:
        emit(bench="transfer_exposed", mode="disaggregated-streaming",
             skipped="no layer-streaming flag in runtime/worker/config.py WorkerConfig yet "
                     "(pass --stream-env PD_NAME once it exists)")
        settings = [("disaggregated", {})]
    length = args.exposed_prompt_tokens
    layer_bytes = length * KV_BYTES_PER_TOKEN_LAYER_SMALL if args.exposed_model == "small" else None
    emit(bench="transfer_exposed", metric="config", model=args.exposed_model, prompt_tokens=length,
         transport=transport, stream_env=var or None, repeats=args.exposed_repeats,
         chunk_tokens=args.exposed_chunk_tokens or "launcher default",
         max_tokens=args.exposed_max_tokens,
         timing="prefill worker's PrefillTimings (via a tap), median; router TTFTs beside them",
         kv_bytes_per_layer=layer_bytes)
    layer_ms = None
    if layer_bytes and bandwidth:
        from runtime.engine.presets import preset_config
        n_layers = preset_config(args.exposed_model).num_hidden_layers
        layer_ms = one_layer_ms(bandwidth, transport, layer_bytes * n_layers, layer_bytes)
        if layer_ms is None:
            emit(bench="transfer_exposed", note=f"part 1 measured no size within 2x of the prompt's K/V "
                 f"({layer_bytes * n_layers / (1 << 20):g} MiB): no one-layer target (add it to --sizes-mib)")
    for k, (mode, env) in enumerate(settings):
        try:
            run = run_cluster(args, transport, env, seed=1000 * (k + 1))
        except Exception as e:  # noqa: BLE001 - report and go on with the other setting
            emit(bench="transfer_exposed", prompt_tokens=length, mode=mode,
                 error=f"{type(e).__name__}: {e}")
            continue
        emit(**rows(mode, length, transport, run, layer_ms))


def rows(mode: str, length: int, transport: str, run: dict, layer_ms: float | None) -> dict:
    """The disaggregated row: the prefill worker's own figures (median over requests), with
    the router's TTFTs of both modes beside them as a cross-check."""
    med = statistics.median
    t = run["timings"]
    coloc, disagg = run["results"]["colocated"], run["results"]["disaggregated"]
    row = dict(bench="transfer_exposed", prompt_tokens=length, mode=mode,
               prefill_ms=round(med(x["compute_ms"] for x in t), 1),
               published_ms=round(med(x["total_ms"] for x in t), 1),
               exposed_ms=round(med(x["total_ms"] - x["queue_ms"] - x["compute_ms"] for x in t), 1),
               worker_transfer_ms=round(med(x["transfer_ms"] for x in t), 1),
               router_ttft_ms=round(med(r.server_ttft_ms for r in disagg), 1),
               router_ttft_colocated_ms=round(med(r.server_ttft_ms for r in coloc), 1),
               runs=[{k: round(v, 1) for k, v in x.items()} for x in t], transport=transport,
               t_exposed_ms=round(med(run["t_exposed"]), 2) if run["t_exposed"] else None,
               t_exposed_runs=[round(x, 2) for x in run["t_exposed"]])
    target = None if layer_ms is None else 1.1 * layer_ms
    if target is not None:
        row.update(one_layer_transfer_ms_est=round(layer_ms, 2), target_exposed_ms=round(target, 2),
                   met=row["exposed_ms"] <= target,
                   t_exposed_met=None if row["t_exposed_ms"] is None else row["t_exposed_ms"] <= target)
    row["sched"] = sched_summary(run.get("sched", {}), target)
    return row
