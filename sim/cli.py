"""What `pdctl plan` and `pdctl profile save` run (ops/pdserve_ops/cli_plan.py parses the
flags; this package holds the simulator, so the SDK-only pdctl imports it on demand)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from sim.calibrate import calibrated, transfer_from_bench
from sim.plan import Planner, Targets, load_profiles
from sim.profile import Overheads, TransferProfile
from sim.report import plot
from sim.workload import Workload


def plan(args: argparse.Namespace, out: TextIO) -> int:
    """`pdctl plan`: search configurations of the trace's workload; print the best."""
    if args.slo_ttft_ms <= 0 or args.slo_tpot_ms <= 0 or args.gpus < 1:
        raise ValueError("--slo-ttft-ms and --slo-tpot-ms must be > 0 and --gpus >= 1")
    profiles = load_profiles(args.profile)
    workload = Workload.from_csv(args.trace).window(args.start, args.requests)
    workload = workload.capped(min(p.engine.max_model_len for p in profiles))
    if len(workload) < 2:
        raise ValueError(f"{args.trace}: fewer than two requests to replay from request {args.start}")
    say = (lambda m: print(f"pdctl plan: {m}", file=sys.stderr)) if not args.quiet else None
    planner = Planner(workload, Targets(args.slo_ttft_ms, args.slo_tpot_ms), rel_tol=args.tolerance, progress=say)
    result = planner.plan(profiles, args.gpus)
    png = plot(result, args.png, f"{Path(args.trace).name}: {args.gpus} GPUs, {args.profile}") if args.png else None
    if args.json:
        d = result.to_dict(args.top)
        d.update(trace=str(args.trace), requests=len(workload), trace_rate_rps=round(workload.rate_rps, 4),
                 profile=args.profile, png=str(png) if png else None)
        out.write(json.dumps(d) + "\n")
        return 0
    _print_plan(result, workload, args, png, out)
    return 0


def _print_plan(result, workload: Workload, args: argparse.Namespace, png, out: TextIO) -> None:
    out.write(f"{len(workload)} requests of {args.trace} (trace rate {workload.rate_rps:.3g} rps), "
              f"TTFT <= {args.slo_ttft_ms:g} ms, TPOT <= {args.slo_tpot_ms:g} ms for 90%, {args.gpus} GPUs, "
              f"{result.runs} simulations\n\n")
    out.write(f"{'CONFIGURATION':<44} {'MODE':<14} {'GPUS':>4} {'GOODPUT rps':>12} {'PER GPU':>9}\n")
    rows = list(result.configurations[:args.top])
    col = result.best("colocated")
    if col is not None and col not in rows:
        rows.append(col)
    for c in rows:
        name = f"{c.prefill} prefill, {c.decode} decode, {c.mixed} mixed x{c.gpus_per_worker} GPU"
        out.write(f"{name:<44} {c.mode:<14} {c.gpus:>4} {c.goodput_rps:>12.3f} {c.goodput_per_gpu:>9.3f}\n")
    out.write(f"\n{result.verdict()}\n")
    if png:
        out.write(f"plot: {png}\n")


def profile_save(workers: list[dict], args: argparse.Namespace, out: TextIO) -> int:
    """`pdctl profile save`: the cluster's calibrated profile as a file."""
    if args.transfer_jsonl:
        transfer = transfer_from_bench(Path(args.transfer_jsonl).read_text().splitlines(), args.transfer_path)
    else:
        transfer = TransferProfile("ucx-shm", args.transfer_latency_ms, args.transfer_gb_per_s)
    overheads = Overheads(args.colocated_ms, args.split_ms, args.handoff_ms)
    name = args.name or Path(args.file).stem
    prof = calibrated(name, workers, transfer, overheads, layers=args.layers, model=args.model,
                      source=f"calibrated from {len(workers)} worker(s)"
                             + (f", transfer fitted to {args.transfer_jsonl}" if args.transfer_jsonl else ""))
    prof.save(args.file)
    e = prof.engine
    out.write(f"saved {args.file}: prefill {e.cost.prefill_base_ms:.3g} + {e.cost.prefill_ms_per_token:.3g}/token ms, "
              f"decode {e.cost.decode_base_ms:.3g} + {e.cost.decode_ms_per_seq:.3g}/seq ms, {e.total_blocks} blocks "
              f"of {e.block_size}, transfer {transfer.latency_ms:.3g} ms + {transfer.gb_per_s:.3g} GB/s\n")
    return 0
