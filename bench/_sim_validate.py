"""Part `validate` of bench/planner.py: the simulator against the real local cluster, as
DistServe validated its simulator against its system.

Per router mode (colocated: 2 decode workers; disaggregated: 1 prefill + 1 decode; auto:
2 mixed), one local cluster of the `tiny` preset:

  1. the workers' own calibrated profiles (Admin.Status: what each measured and
     registered) become the simulator's engine (sim/calibrate.py, their median);
  2. the fixed costs the profiles do not hold (a colocated and a split TTFT's RPC hops,
     the hand-off's control plane) are read off isolated requests: each is the real
     request's time less the simulator's with that cost at 0;
  3. at each rate: the trace slice replayed on the cluster twice (the second run measures
     the noise of the same real run), and once in the simulator; per request, predicted
     against observed TTFT and TPOT; per rate, attainment of both targets.

The slice keeps the trace's arrival pattern; its lengths are divided (--prompt-div,
--output-div) and capped so a 2-core CPU serves it (the `tiny` model, one compute thread
per worker).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import statistics
from collections import Counter
from collections.abc import Sequence

import psutil
from _goodput_run import REQUEST_DEADLINE_S, Router
from _goodput_workload import random_prompt

from pdserve_client.aio import AsyncClient
from pdserve_client.types import PdError, client_tpot_ms
from sim.calibrate import engine_from_workers
from sim.cluster import ClusterSpec as SimSpec
from sim.cluster import Simulation
from sim.metrics import RunResult
from sim.profile import HostProfile, Overheads, SimProfile, TransferProfile
from sim.workload import Request, Workload
from tooling.cluster.launcher import ClusterSpec, LocalCluster

SPECS = {"colocated": ((0, 2, 0), SimSpec(decode=2)), "disaggregated": ((1, 1, 0), SimSpec(prefill=1, decode=1)),
         "auto": ((0, 0, 2), SimSpec(mixed=2))}
"""Mode -> ((prefill, decode, mixed) of the local cluster, the simulated one)."""

LOCAL_TRANSFER = TransferProfile("ucx-shm", 1.0, 1.0, streamed=True)
"""The local hand-off's transfer: tiny's K/V is a few KiB a block, so its time is the fixed
part (the measured control plane goes to Overheads.handoff_ms)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Seen:
    """One request as the client saw it."""

    ttft_ms: float
    tpot_ms: float
    route: str
    ok: bool
    first_gap_ms: float = float("nan")
    """Token 0 to token 1 at the client (a split route's hand-off is in it)."""
    later_gap_ms: float = float("nan")
    """The mean gap after token 1 (the decode worker's cadence)."""


def slice_of(w: Workload, start: int, n: int, prompt_div: float, output_div: float, max_prompt: int,
             max_output: int) -> Workload:
    """`n` requests from `start`, lengths divided and capped (outputs >= 2: a TPOT exists)."""
    part = w.window(start, n)
    return Workload(tuple(dataclasses.replace(
        r, prompt_tokens=max(2, min(max_prompt, round(r.prompt_tokens / prompt_div))),
        output_tokens=max(2, min(max_output, round(r.output_tokens / output_div)))) for r in part.requests),
        f"{w.name}[{start}:{start + n}]")


def local_spec(mode: str, out_dir: str, num_blocks: int) -> ClusterSpec:
    p, d, m = SPECS[mode][0]
    return ClusterSpec(prefill=p, decode=d, mixed=m, model="tiny", mode=mode, num_blocks=num_blocks, torch_threads=1,
                       lease_ttl_s=10.0, reservation_ttl_s=120.0, state_dir=f"{out_dir}/validate-{mode}",
                       env={"PD_TORCH_THREADS": "1", "PD_ROUTER_MODE": mode, "PD_ROUTER_PREFILL_TIMEOUT_S": "120",
                            "PD_ROUTER_FIRST_TOKEN_TIMEOUT_S": "120"}, traces=False)


def prompts_for(w: Workload, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(f"validate/{seed}")
    return [random_prompt(rng, r.prompt_tokens, vocab) for r in w.requests]


async def _one(client: AsyncClient, prompt: list[int], r: Request, slo: tuple[float, float], seed: int) -> Seen:
    try:
        res = await client.generate_full(prompt_ids=prompt, max_tokens=r.output_tokens, seed=seed, ignore_eos=True,
                                         slo_ttft_ms=slo[0], slo_tpot_ms=slo[1], deadline_s=REQUEST_DEADLINE_S)
    except PdError as e:
        return Seen(float("inf"), float("inf"), f"error:{e.code}", False)
    t = res.token_times_ms
    first = t[1] - t[0] if len(t) > 1 else float("nan")
    later = (t[-1] - t[1]) / (len(t) - 2) if len(t) > 2 else float("nan")
    return Seen(res.ttft_ms, client_tpot_ms(res.latency_ms, res.ttft_ms, res.num_tokens), res.route, True, first, later)


async def replay(router: Router, w: Workload, prompts: Sequence[list[int]], slo: tuple[float, float]) -> list[Seen]:
    """Open loop: request i at its arrival time (the workload's own, already at its rate)."""
    loop = asyncio.get_running_loop()
    async with AsyncClient(router.address, timeout_s=30.0, tls_files=router.tls_files) as client:
        t0, tasks = loop.time(), []
        for i, r in enumerate(w.requests):
            due = t0 + r.arrival_s
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            tasks.append(asyncio.create_task(_one(client, prompts[i], r, slo, i)))
        return list(await asyncio.gather(*tasks))


def engine_profile(router: Router):
    """The cluster's workers' registered profiles, their median (sim/calibrate.py)."""
    async def status():
        async with AsyncClient(router.address, timeout_s=30.0, tls_files=router.tls_files) as client:
            return await client.status()
    workers = asyncio.run(status()).workers
    return engine_from_workers([dataclasses.asdict(w) for w in workers], layers=1)


def isolated(prompt_tokens: int, output_tokens: int, n: int, gap_s: float = 0.25) -> Workload:
    """`n` requests of one shape, far enough apart that none waits for another, close enough
    that the processes stay warm (seconds apart, every hop pays an idle wake-up the loaded
    cluster does not)."""
    return Workload(tuple(Request(i * gap_s, prompt_tokens, output_tokens) for i in range(n)), "isolated")


def burst(prompt_tokens: int, output_tokens: int, n: int) -> Workload:
    """`n` requests of one shape at once (a decode batch of about `n`)."""
    return Workload(tuple(Request(0.0, prompt_tokens, output_tokens) for _ in range(n)), "burst")


def simulate(mode: str, profile: SimProfile, w: Workload, slo: tuple[float, float]) -> RunResult:
    return Simulation(SPECS[mode][1], profile, mode, slo[0], slo[1]).run(w)


@dataclasses.dataclass(frozen=True, slots=True)
class Fixed:
    """What the workers' profiles do not hold, read off isolated requests and a burst: the
    routes' fixed costs and the serving loop's per-step cost beyond the model's (the engine
    loop, a token's callbacks and its gRPC hops: the profile measures the model alone)."""

    overheads: Overheads = Overheads(0.0, 0.0, 0.0)
    host: HostProfile | None = None
    step_ms: float = 0.0
    """Added to every decode step."""
    seq_ms: float = 0.0
    """Added per sequence of a decode step."""

    def apply(self, name: str, engine) -> SimProfile:
        cost = dataclasses.replace(engine.cost, decode_base_ms=engine.cost.decode_base_ms + self.step_ms,
                                   decode_ms_per_seq=engine.cost.decode_ms_per_seq + self.seq_ms)
        return SimProfile(name, dataclasses.replace(engine, cost=cost), LOCAL_TRANSFER, self.overheads,
                          source="calibrated (this run)", host=self.host)


def cpu_ms(cluster: LocalCluster) -> float:
    """CPU time so far of every process of the cluster (Redis included) and of this one (the
    client), ms."""
    return sum(cpu_by_process(cluster).values())


def cpu_by_process(cluster: LocalCluster) -> dict[str, float]:
    """CPU time so far of each process of the cluster (Redis included) and of this one
    ("client"), ms."""
    out = {}
    for name, proc in cluster.procs.items():
        try:
            t = psutil.Process(proc.pid).cpu_times()
        except psutil.Error:
            continue
        out[name] = (t.user + t.system + t.children_user + t.children_system) * 1000.0
    me = psutil.Process().cpu_times()
    out["client"] = (me.user + me.system) * 1000.0
    return out


def measured_cpu(cluster: LocalCluster, router: Router, w: Workload) -> tuple[float, float, list[Seen]]:
    """(CPU ms, wall ms, what the client saw) of replaying `w`."""
    import time

    c0, t0 = cpu_ms(cluster), time.perf_counter()
    seen = asyncio.run(replay(router, w, prompts_for(w, 256, 5), (0.0, 0.0)))
    return cpu_ms(cluster) - c0, (time.perf_counter() - t0) * 1000.0, seen


def _residual_cpu(cluster: LocalCluster, router: Router, engine, mode: str, w: Workload, idle_per_ms: float) -> float:
    """CPU of replaying `w` less the idle processes' (the same wall time at rest) and the
    model's compute (the simulator's busy time of the same burst on dedicated cores)."""
    cpu, wall, _ = measured_cpu(cluster, router, w)
    sim = Simulation(SPECS[mode][1], Fixed().apply("model", engine), mode)
    sim.run(w)
    return max(0.0, cpu - idle_per_ms * wall - sum(x.busy_ms for x in sim.workers))


def _idle_cpu_per_ms(cluster: LocalCluster, seconds: float = 3.0) -> float:
    import time

    c0, t0 = cpu_ms(cluster), time.perf_counter()
    time.sleep(seconds)
    return (cpu_ms(cluster) - c0) / ((time.perf_counter() - t0) * 1000.0)


def host_profile(cluster: LocalCluster, router: Router, engine, prompt_tokens: int, n: int = 24) -> HostProfile:
    """The serving path's CPU per token and per request on this machine (a colocated
    cluster): two bursts of `n` requests, 2 and 34 tokens each, solved for the two unknowns."""
    idle = _idle_cpu_per_ms(cluster)
    short, long = (_residual_cpu(cluster, router, engine, "colocated", burst(prompt_tokens, k, n), idle)
                   for k in (2, 34))
    tok = max(0.0, (long - short) / (n * 32))
    return HostProfile(float(psutil.cpu_count() or 1), tok, max(0.0, short / n - 2 * tok))


def split_cpu(cluster: LocalCluster, router: Router, engine, host: HostProfile, prompt_tokens: int,
              n: int = 24) -> HostProfile:
    """A split request's extra CPU (a disaggregated cluster): a burst of `n` 2-token requests,
    less what the colocated path costs."""
    idle = _idle_cpu_per_ms(cluster)
    resid = _residual_cpu(cluster, router, engine, "disaggregated", burst(prompt_tokens, 2, n), idle)
    return dataclasses.replace(host, split_cpu_ms=max(0.0, resid / n - host.request_cpu_ms - 2 * host.token_cpu_ms))


def sim_cores(profile: SimProfile, sim: RunResult) -> float:
    """The cores the simulation says the run kept busy: the workers' compute plus the serving
    path's CPU (per token, per request, per hand-off), over the run's span."""
    busy = sum(u * sim.workers[role] for role, u in sim.utilisation.items())
    h = profile.host
    if h is None:
        return busy
    tokens = sum(r.output_tokens for r in sim.requests if r.served)
    split = sum(1 for r in sim.requests if r.route == "disaggregated")
    cpu = tokens * h.token_cpu_ms + len(sim.requests) * h.request_cpu_ms + split * h.split_cpu_ms
    return busy + cpu / max(1.0, sim.span_ms)


def _median_diff(real: list[Seen], sim: RunResult, field: str) -> float | None:
    pairs = [(getattr(x, field), getattr(r, field)) for x, r in zip(real, sim.requests)
             if x.ok and r.served and getattr(x, field) == getattr(x, field) and getattr(r, field) == getattr(r, field)]
    return statistics.median(a - b for a, b in pairs) if pairs else None


def replay_with_steps(cluster: LocalCluster, router: Router, w: Workload,
                      prompts: Sequence[list[int]]) -> tuple[list[Seen], tuple[float, float, float] | None]:
    """Replay `w` (no targets) and read the decoding workers' engine loops meanwhile: what the
    clients saw, and (mean batch, mean decode step wall ms, its CPU ms) over all their steps
    (None: no step)."""
    before = loop_counters(cluster)
    seen = asyncio.run(replay(router, w, prompts, (0.0, 0.0)))
    deltas = loop_deltas(before, loop_counters(cluster)).values()
    steps, seqs, wall, cpu = (sum(d.get(k, 0.0) for d in deltas) for k in (STEPS, SEQS, STEP_WALL, STEP_CPU))
    return seen, ((seqs / steps, 1000.0 * wall / steps, 1000.0 * cpu / steps) if steps else None)


def step_costs(engine, iso: Workload, one: tuple[float, float, float] | None, bw: Workload,
               many: tuple[float, float, float] | None) -> tuple[float, float] | None:
    """(per step, per sequence) decode cost beyond the profile's, from the engine loops' steps
    alone (`one`) and in a burst (`many`), each (batch, wall ms, CPU ms) of replay_with_steps;
    None when they do not say. Alone, the wall time: what a step costs beyond the model (the
    loop, the callbacks, and the GIL and core waits it pays even on a quiet host). Per sequence,
    the CPU time's growth over the burst, times the same wall/CPU ratio: the burst's wall time
    also holds its own prefills' competition for the cores, which the host model adds itself."""
    if one is None or many is None or many[0] < one[0] + 0.5 or one[2] <= 0:
        return None
    ratio = one[1] / one[2]

    def model(w: Workload, batch: float) -> float:
        ctx = statistics.fmean(r.prompt_tokens + r.output_tokens / 2 for r in w.requests)
        return engine.decode_step_ms(max(1, round(batch)), int(batch * ctx))

    seq = max(0.0, ratio * (many[2] - one[2]) / (many[0] - one[0])
              - (model(bw, many[0]) - model(iso, one[0])) / (many[0] - one[0]))
    step = max(0.0, one[1] - model(iso, one[0]) - seq * one[0])
    return step, seq


def fixed_costs(mode: str, engine, real_iso: list[Seen], iso: Workload, real_burst: list[Seen], bw: Workload,
                known: Fixed, steps: tuple = (None, None)) -> Fixed:
    """Colocated: the per-step costs and colocated_ms (TTFT alone). The per-step costs are the
    engine loops' measured decode steps less the profile's (`step_costs`, from `steps`:
    replay_with_steps of `iso` and `bw`; without them, the clients' TPOT alone and in the
    burst, which carries the relay's jitter and the burst's competition for the cores).
    Disaggregated: split_ms (TTFT) and handoff_ms (the first
    token gap), then admit_ms (the burst's stall); auto: what the two found."""
    if mode == "colocated":
        zero = Fixed(host=known.host)
        measured = step_costs(engine, iso, steps[0], bw, steps[1])
        if measured is not None:
            step, seq = measured
        else:
            d1 = _median_diff(real_iso, simulate(mode, zero.apply("zero", engine), iso, (0.0, 0.0)), "tpot_ms") or 0.0
            db = _median_diff(real_burst, simulate(mode, zero.apply("zero", engine), bw, (0.0, 0.0)), "tpot_ms") or 0.0
            seq = max(0.0, (db - d1) / max(1, len(bw) - 1))
            step = max(0.0, d1 - seq)
        base = Fixed(Overheads(0.0, 0.0, 0.0), known.host, step, seq)
        ttft = _median_diff(real_iso, simulate(mode, base.apply("steps", engine), iso, (0.0, 0.0)), "ttft_ms") or 0.0
        return Fixed(dataclasses.replace(known.overheads, colocated_ms=max(0.0, ttft)), known.host, step, seq)
    if mode == "disaggregated":
        probe = dataclasses.replace(known, overheads=dataclasses.replace(known.overheads, split_ms=0.0, handoff_ms=0.0,
                                                                          admit_ms=0.0))
        o = probe.overheads
        for _ in range(2):  # TTFT holds split_ms, the first token gap the hand-off (twice: the simulator
            # stretches both with the workers' load, sim/cluster.py `_queued`)
            s = simulate(mode, dataclasses.replace(known, overheads=o).apply("probe", engine), iso, (0.0, 0.0))
            o = dataclasses.replace(o, split_ms=max(0.0, o.split_ms + (_median_diff(real_iso, s, "ttft_ms") or 0.0)))
            s = simulate(mode, dataclasses.replace(known, overheads=o).apply("probe", engine), iso, (0.0, 0.0))
            o = dataclasses.replace(o, handoff_ms=max(0.0, o.handoff_ms + (_median_diff(real_iso, s, "first_gap_ms")
                                                                           or 0.0)))
        # a burst's streams each sit through every hand-off of the burst admitted beside them
        s = simulate(mode, dataclasses.replace(known, overheads=o).apply("probe", engine), bw, (0.0, 0.0))
        stall = (_median_diff(real_burst, s, "tpot_ms") or 0.0) * (bw.requests[0].output_tokens - 1) / len(bw)
        return dataclasses.replace(known, overheads=dataclasses.replace(o, admit_ms=max(0.0, stall)))
    return known


def errors(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Per-request relative error of a against b: median and p90 of |a/b - 1|, and the
    relative difference of the medians."""
    pairs = [(x, y) for x, y in zip(a, b) if y > 0 and x == x and y == y and x != float("inf") and y != float("inf")]
    if not pairs:
        return {"n": 0}
    rel = sorted(abs(x / y - 1) for x, y in pairs)
    med_a, med_b = statistics.median(x for x, _ in pairs), statistics.median(y for _, y in pairs)
    return {"n": len(pairs), "median_abs_rel": round(statistics.median(rel), 4),
            "p90_abs_rel": round(rel[min(len(rel) - 1, int(0.9 * len(rel)))], 4),
            "medians": [round(med_a, 3), round(med_b, 3)], "median_rel_diff": round(med_a / med_b - 1, 4)}


def attainment(seen: Sequence[Seen], slo: tuple[float, float]) -> float:
    return sum(s.ok and s.ttft_ms <= slo[0] and s.tpot_ms <= slo[1] for s in seen) / max(1, len(seen))


def _median(xs) -> float:
    xs = [x for x in xs if x == x and x != float("inf")]
    return statistics.median(xs) if xs else float("nan")


def compare(real: list[Seen], again: list[Seen], sim: RunResult, slo: tuple[float, float]) -> dict:
    """One rate's row: attainment (each real run, their mean, the simulation) and TTFT and TPOT
    (per-request errors of the simulation against run 1 and of run 2 against run 1: the noise;
    medians of each run, of both runs pooled, of the simulation), and the checks: attainment
    within 5 points of the runs' mean (or inside their spread widened by 5 points), each
    median within 15% of the pooled one (or inside the two runs' own difference)."""
    a = (attainment(real, slo), attainment(again, slo), sim.attainment()["both"])
    served = [s.ok and r.served for s, r in zip(real, sim.requests)]
    row = {"attainment": {"real": round(a[0], 4), "repeat": round(a[1], 4), "sim": round(a[2], 4)},
           "routes": {"real": dict(Counter(s.route for s in real)), "sim": sim.routes},
           "errors": sum(not s.ok for s in real) + sum(not s.ok for s in again)}
    mean = (a[0] + a[1]) / 2
    checks = {"attainment": abs(a[2] - mean) <= 0.05,
              "attainment_in_noise": min(a[0], a[1]) - 0.05 <= a[2] <= max(a[0], a[1]) + 0.05}
    for key, field in (("ttft", "ttft_ms"), ("tpot", "tpot_ms")):
        s_vals = [getattr(r, field) if ok else float("nan") for r, ok in zip(sim.requests, served)]
        r1, r2 = [getattr(x, field) for x in real], [getattr(x, field) for x in again]
        m1, m2, ms, mp = _median(r1), _median(r2), _median(s_vals), _median(r1 + r2)
        noise = abs(m2 / m1 - 1) if m1 > 0 else float("nan")
        row[key] = {"sim_vs_real": errors(s_vals, r1), "repeat_vs_real": errors(r2, r1),
                    "median_ms": {"real": round(m1, 3), "repeat": round(m2, 3), "pooled": round(mp, 3),
                                  "sim": round(ms, 3)},
                    "sim_vs_pooled": round(ms / mp - 1, 4) if mp > 0 else None, "noise": round(noise, 4)}
        checks[key] = mp > 0 and abs(ms / mp - 1) <= 0.15
        checks[f"{key}_in_noise"] = mp > 0 and abs(ms / mp - 1) <= max(0.15, noise)
    row["checks"] = checks
    return row


def gaps(seen: Sequence[Seen], sim: RunResult) -> dict[str, float]:
    """Medians over the served requests of the first token gap (a split route's hand-off is in
    it), real and simulated, and of the real later gaps' mean (the cadence after it)."""
    ok = [s for s in seen if s.ok and s.first_gap_ms == s.first_gap_ms and s.later_gap_ms == s.later_gap_ms]
    first_sim = [r.first_gap_ms for r in sim.requests if r.served and r.first_gap_ms == r.first_gap_ms]
    out = {}
    if ok:
        out.update(first=round(statistics.median(s.first_gap_ms for s in ok), 3),
                   later=round(statistics.median(s.later_gap_ms for s in ok), 3))
    if first_sim:
        out["first_sim"] = round(statistics.median(first_sim), 3)
    return out


def loop_counters(cluster: LocalCluster) -> dict[str, dict[str, float]]:
    """Per worker process: its engine loop's pd_engine_loop_* counters now (scraped over mTLS
    with the monitor's certificate), keyed `name/label values`."""
    from prometheus_client.parser import text_string_to_metric_families

    from autoscaler.observe import scrape

    ctx = cluster.identity("monitor").client_ssl()
    out: dict[str, dict[str, float]] = {}
    for name, proc in cluster.procs.items():
        if not proc.metrics_url or cluster.roles.get(name) not in ("prefill", "decode", "mixed"):
            continue
        out[name] = {s.name + "".join(f"/{v}" for _, v in sorted(s.labels.items())): s.value
                     for f in text_string_to_metric_families(scrape(proc.metrics_url, ctx))
                     if f.name.startswith("pd_engine_loop") for s in f.samples if s.name.endswith("_total")}
    return out


def loop_use(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
             wall_s: float) -> dict[str, dict[str, float]]:
    """Per worker, what its engine loop did between two `loop_counters`: decode steps, the mean
    step's wall and CPU ms and mean batch, and the share of the wall time in each phase."""
    out = {}
    for name, d in loop_deltas(before, after).items():
        steps = d.get(STEPS, 0.0)
        per = {"steps": int(steps)}
        if steps:
            per.update(step_wall_ms=round(1000 * d[STEP_WALL] / steps, 4),
                       step_cpu_ms=round(1000 * d[STEP_CPU] / steps, 4), batch=round(d[SEQS] / steps, 3))
        for phase in ("commands", "prefill", "decode", "idle"):
            per[f"{phase}_share"] = round(d.get(f"pd_engine_loop_seconds_total/wall/{phase}", 0.0) / wall_s, 4)
        out[name] = per
    return out


STEPS, SEQS = "pd_engine_loop_runs_total/decode", "pd_engine_loop_decoded_sequences_total"
STEP_WALL, STEP_CPU = "pd_engine_loop_seconds_total/wall/decode", "pd_engine_loop_seconds_total/cpu/decode"
"""`loop_counters` keys: decode steps, sequences over them, their wall and CPU seconds."""


def loop_deltas(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per worker, how much each of its `loop_counters` grew between two readings."""
    return {name: {k: v - before.get(name, {}).get(k, 0.0) for k, v in a.items()} for name, a in after.items()}


def start(mode: str, out_dir: str, num_blocks: int) -> tuple[LocalCluster, Router]:
    cluster = LocalCluster(local_spec(mode, out_dir, num_blocks))
    return cluster, Router(cluster.up(), cluster.client_files())
