"""Simulator and planner benchmark (docs/design.md, "The simulator"; docs/capacity.md).

    .venv/bin/python bench/planner.py --part speed      # 10,000 requests over 64 workers, one core
    .venv/bin/python bench/planner.py --part validate   # the simulator against the local cluster (~20 min)
    .venv/bin/python bench/planner.py --part answers    # the planner on both Azure traces, 8/16/64 GPUs
    .venv/bin/python bench/planner.py                   # all three

stdout: JSON lines, each with "bench": "planner" and a "part":
  speed     {"requests", "workers", "mode", "cpu_s", "wall_s", "decision_us", "baseline"...}: the
            simulation's CPU time, and as its baseline the router decisions alone (the
            Planner's `plan` per arrival, the same snapshots): what share the engine model adds
  validate  per mode and rate: attainment (real, the real run repeated, simulated) and per-request
            TTFT and TPOT errors (sim vs real, and the repeat vs real: the noise), each worker's
            engine loop during the first real run (mean step wall and CPU ms, batch, phase shares:
            `engine_loops`), then a
            `target` line per mode (attainment within 5 points at every rate, TTFT and TPOT
            medians within 15%), met, or inside the measured noise, or not met
  answers   per trace and GPU budget: the best colocated, disaggregated and auto configurations
            (goodput per GPU) and auto against the better fixed mode; `target` lines for 64 GPUs
The lines also go to <out-dir>/planner.jsonl; plots to <out-dir>/planner-*.png.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sim.cluster import ClusterSpec, Simulation  # noqa: E402
from sim.plan import Planner, Targets, load_profile  # noqa: E402
from sim.report import plot  # noqa: E402
from sim.workload import Workload, interleave  # noqa: E402

TRACES = REPO.parent / "shared" / "traces"
CONV, CODE = "azure-llm-2023-conv.csv", "azure-llm-2023-code.csv"


class Out:
    def __init__(self, path: Path):
        self.file = open(path, "a")

    def emit(self, part: str, **row) -> None:
        line = json.dumps({"bench": "planner", "part": part, **row})
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def trace(args, name: str) -> Workload:
    path = Path(args.traces) / name
    if not path.exists():
        raise SystemExit(f"bench/planner.py: {path} not found (--traces DIR: the Azure traces' folder)")
    return Workload.from_csv(path)


# ---- speed ------------------------------------------------------------------------------------
def part_speed(args, out: Out) -> None:
    """10,000 requests of the conversation trace over 64 workers (auto: 16 prefill + 48 decode)."""
    prof = load_profile("h100-llama3-8b-tp1")
    w = trace(args, CONV).head(args.speed_requests).scaled(args.speed_rate)
    for mode, spec in (("auto", ClusterSpec(prefill=16, decode=48)), ("colocated", ClusterSpec(mixed=64))):
        t0, c0 = time.perf_counter(), time.process_time()
        res = Simulation(spec, prof, mode, 2000, 50).run(w)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        out.emit("speed", mode=mode, requests=len(w), workers=spec.workers, rate_rps=args.speed_rate,
                 cpu_s=round(cpu, 2), wall_s=round(wall, 2), decision_us=round(res.decision_us, 1),
                 router_share=round(res.decision_us * len(w) / 1e6 / cpu, 3),
                 attainment=res.attainment(), routes=res.routes,
                 target="10,000 requests over 64 workers in < 60 s on one core", met=cpu < 60.0,
                 max_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))


# ---- validate ---------------------------------------------------------------------------------
def part_validate(args, out: Out) -> None:
    import _sim_validate as v

    w_full = trace(args, CONV)
    base = v.slice_of(w_full, args.start, args.requests, args.prompt_div, args.output_div, args.max_prompt,
                      args.max_output)
    med_p = int(sorted(r.prompt_tokens for r in base.requests)[len(base) // 2])
    iso, bw = v.isolated(med_p, 16, args.isolated), v.burst(med_p, 16, 8)
    known, slo, rates = v.Fixed(), None, None
    for mode in args.modes.split(","):
        cluster, router = v.start(mode, args.out_dir, args.num_blocks)
        try:
            for _ in range(args.warmup):  # a fresh cluster's first minute is slower (allocators, caches, the
                # router's corrections): what it measures next is its steady state
                asyncio.run(v.replay(router, bw, v.prompts_for(bw, 256, 98), (0.0, 0.0)))
                asyncio.run(v.replay(router, base.scaled(args.warmup_rate), v.prompts_for(base, 256, 99),
                                     (0.0, 0.0)))
            engine = v.engine_profile(router)
            if known.host is None and not args.no_host:
                known = v.Fixed(host=v.host_profile(cluster, router, engine, med_p))
            if mode == "disaggregated" and known.host is not None:
                known = dataclasses.replace(known, host=v.split_cpu(cluster, router, engine, known.host, med_p))
            real_iso, steps_iso = v.replay_with_steps(cluster, router, iso, v.prompts_for(iso, 256, 7))
            real_burst, steps_burst = v.replay_with_steps(cluster, router, bw, v.prompts_for(bw, 256, 8))
            known = v.fixed_costs(mode, engine, real_iso, iso, real_burst, bw, known, (steps_iso, steps_burst))
            profile = known.apply(f"local-{mode}", engine)
            if slo is None:
                ok = [s for s in real_iso if s.ok]
                slo = (args.ttft_x * sorted(s.ttft_ms for s in ok)[len(ok) // 2],
                       args.tpot_x * sorted(s.tpot_ms for s in ok)[len(ok) // 2])
                rates = pick_rates(args, base, profile, slo)
            out.emit("validate", mode=mode, kind="profile", engine=engine.cost.to_json(), sim_profile=profile.to_dict(),
                     overheads=vars_of(known.overheads), host=vars_of(known.host) if known.host else None,
                     step_ms=round(known.step_ms, 4),
                     seq_ms=round(known.seq_ms, 4), slo_ms=[round(x, 2) for x in slo], rates=rates,
                     isolated={"real_ttft_ms": [round(s.ttft_ms, 2) for s in real_iso],
                               "real_tpot_ms": [round(s.tpot_ms, 3) for s in real_iso],
                               "burst_tpot_ms": [round(s.tpot_ms, 3) for s in real_burst]})
            rows = [validate_rate(args, out, v, cluster, router, mode, profile, base.scaled(rate), slo)
                    for rate in rates]
            emit_targets(out, mode, rows)
        finally:
            cluster.down()


def emit_targets(out: Out, mode: str, rows: list[dict]) -> None:
    """Per mode: each target met at every rate, or met only inside the measured noise, or not."""
    for what, target in (("attainment", "attainment within 5 points at every rate"),
                         ("ttft", "TTFT median within 15% at every rate"),
                         ("tpot", "TPOT median within 15% at every rate")):
        met = all(r["checks"][what] for r in rows)
        noise = all(r["checks"][f"{what}_in_noise"] for r in rows)
        out.emit("target", mode=mode, target=target, met=met, met_inside_noise=noise,
                 per_rate=[{"rate_rps": r["rate_rps"], "met": r["checks"][what],
                            "inside_noise": r["checks"][f"{what}_in_noise"]} for r in rows])


def vars_of(o) -> dict:
    return {k: round(getattr(o, k), 3) for k in o.__dataclass_fields__}


def pick_rates(args, base: Workload, profile, slo) -> list[float]:
    """Rates around the simulator's colocated goodput for the slice (attainment's knee)."""
    if args.rates:
        return [float(x) for x in args.rates.split(",")]
    from sim.metrics import goodput_search
    from sim.plan import capacity_guess

    g = goodput_search(lambda r: Simulation(ClusterSpec(decode=2), profile, "colocated", *slo).run(base.scaled(r)),
                       capacity_guess(base, profile, 2), rel_tol=0.05).goodput_rps
    return [round(g * f, 3) for f in (0.5, 0.8, 1.0, 1.3)]


def validate_rate(args, out: Out, v, cluster, router, mode: str, profile, w: Workload, slo) -> dict:
    prompts = v.prompts_for(w, 256, args.seed)
    loops0 = v.loop_counters(cluster)
    c0, t0 = v.cpu_by_process(cluster), time.perf_counter()
    real = asyncio.run(v.replay(router, w, prompts, slo))
    wall_s = time.perf_counter() - t0
    per_process = {k: round((x - c0.get(k, 0.0)) / (wall_s * 1000.0), 3) for k, x in v.cpu_by_process(cluster).items()}
    cores_used = sum(per_process.values())
    loops = v.loop_use(loops0, v.loop_counters(cluster), wall_s)
    again = asyncio.run(v.replay(router, w, prompts, slo))
    sim = v.simulate(mode, profile, w, slo)
    row = {"rate_rps": round(w.rate_rps, 4), "requests": len(w), **v.compare(real, again, sim, slo),
           "cores_busy": {"real": round(cores_used, 3), "sim": round(v.sim_cores(profile, sim), 3),
                          "real_by_process": per_process},
           "engine_loops": loops, "gaps_ms": v.gaps(real, sim)}
    out.emit("validate", mode=mode, **row)
    return row


# ---- answers ----------------------------------------------------------------------------------
def part_answers(args, out: Out) -> None:
    conv = trace(args, CONV).window(args.answers_start, args.answers_requests)
    code = trace(args, CODE).window(args.answers_start, args.answers_requests)
    mixed = interleave([conv.scaled(conv.rate_rps), code.scaled(conv.rate_rps)], name="conv+code")
    targets = Targets(args.slo_ttft_ms, args.slo_tpot_ms)
    prof = load_profile(args.profile)
    wanted = args.answer_traces.split(",")
    for name, w in [(n, w) for n, w in (("conv", conv), ("code", code), ("conv+code", mixed)) if n in wanted]:
        for gpus in [int(g) for g in args.gpus.split(",")]:
            t0 = time.process_time()
            plan = Planner(w, targets, rel_tol=args.tolerance).plan([prof], gpus)
            best = {m: plan.best(m) for m in ("colocated", "disaggregated", "auto")}
            fixed = max((best[m] for m in ("colocated", "disaggregated") if best[m]), key=lambda c: c.goodput_per_gpu)
            ratio = best["auto"].goodput_per_gpu / fixed.goodput_per_gpu if fixed.goodput_per_gpu else None
            png = plot(plan, Path(args.out_dir) / f"planner-{name}-{gpus}.png", f"{name}: {gpus} GPUs, {prof.name}")
            out.emit("answers", trace=name, gpus=gpus, profile=prof.name, requests=len(w),
                     slo_ms=[args.slo_ttft_ms, args.slo_tpot_ms],
                     best={m: (c.to_dict() if c else None) for m, c in best.items()},
                     auto_vs_better_fixed=round(ratio, 3) if ratio else None, verdict=plan.verdict(),
                     simulations=plan.runs, cpu_s=round(time.process_time() - t0, 1), png=str(png))
            if gpus == 64:
                need = 1.2 if name == "conv+code" else 1.0
                out.emit("target", target=f"auto >= {need}x the better fixed mode at 64 GPUs on {name}",
                         ratio=round(ratio, 3) if ratio else None, met=bool(ratio and ratio >= need))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="speed,validate,answers", help="comma-separated: speed, validate, answers")
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "out" / "planner"))
    ap.add_argument("--traces", default=str(TRACES), help="folder of the Azure traces")
    ap.add_argument("--speed-requests", type=int, default=10000)
    ap.add_argument("--speed-rate", type=float, default=150.0)
    ap.add_argument("--modes", default="colocated,disaggregated,auto", help="validate: router modes, in order")
    ap.add_argument("--requests", type=int, default=120, help="validate: requests of the slice")
    ap.add_argument("--start", type=int, default=1000, help="validate: first request of the slice")
    ap.add_argument("--prompt-div", type=float, default=4.0)
    ap.add_argument("--output-div", type=float, default=4.0)
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--max-output", type=int, default=48)
    ap.add_argument("--num-blocks", type=int, default=1024)
    ap.add_argument("--isolated", type=int, default=6, help="validate: isolated requests for the fixed costs")
    ap.add_argument("--no-host", action="store_true",
                    help="validate: no shared-host model (every worker owns a core, nothing else runs)")
    ap.add_argument("--warmup", type=int, default=1, help="validate: unmeasured replays of the slice first")
    ap.add_argument("--warmup-rate", type=float, default=4.0, help="validate: their rate")
    ap.add_argument("--ttft-x", type=float, default=4.0, help="validate: TTFT target, x the isolated median")
    ap.add_argument("--tpot-x", type=float, default=2.0, help="validate: TPOT target, x the isolated median")
    ap.add_argument("--rates", default="", help="validate: comma-separated rates (default: around the knee)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="h100-llama3-8b-tp1", help="answers: the profile")
    ap.add_argument("--gpus", default="8,16,64", help="answers: GPU budgets")
    ap.add_argument("--answer-traces", default="conv,code,conv+code", help="answers: which traces (comma-separated)")
    ap.add_argument("--slo-ttft-ms", type=float, default=500.0, help="answers: TTFT target")
    ap.add_argument("--slo-tpot-ms", type=float, default=30.0, help="answers: TPOT target")
    ap.add_argument("--answers-requests", type=int, default=1000)
    ap.add_argument("--answers-start", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=0.04)
    args = ap.parse_args()
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    out = Out(Path(args.out_dir) / "planner.jsonl")
    parts = {"speed": part_speed, "validate": part_validate, "answers": part_answers}
    for p in args.part.split(","):
        parts[p](args, out)


if __name__ == "__main__":
    main()
