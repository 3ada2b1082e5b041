"""Goodput benchmark: highest request rate at which >= 90% of requests meet both SLOs.

    .venv/bin/python bench/goodput.py            # full run, about 19 minutes on 2 cores
    .venv/bin/python bench/goodput.py --quick    # smoke run of every path, a few minutes

For each router mode (colocated, disaggregated, auto) a fresh local cluster
with the same number of worker processes (colocated: 2 decode workers that
both prefill and decode; disaggregated: 1 prefill + 1 decode; auto: 2 mixed
workers, each able to prefill, decode or both; --auto-workers split gives auto
1 prefill + 1 decode), the
`small` preset and one torch thread per worker. First, on the first cluster,
single requests measure the unloaded TTFT and TPOT of each request class;
the SLOs are multiples of those. Then, per workload (`long`, `short`,
`mixed`; see _goodput_workload.py), a coarse-to-fine rate search (see
_goodput_report.py) replays the same seeded trace at each rate, open loop,
through the SDK, and scores TTFT, TPOT and joint attainment per rate.

stdout: JSON lines, all with "bench": "goodput" and a "kind":
  config  every choice the run made (lengths, counts, SLO factors, search, cluster)
  slo     the measured single-request latencies and the SLOs derived from them
  rate    one rate point: attainments, latency quantiles, routes taken, errors
  goodput {"workload", "mode", "goodput_rps", "ratio_vs_colocated", ...} per sweep
  target  the targets (docs/benchmarks.md, Goodput: disaggregated >= 1.5x colocated on
          long; auto >= 0.95x the better of the two on long and short), met or not
  note    anything skipped, and why
The same lines go to <out-dir>/goodput.jsonl, the plot to <out-dir>/goodput.png,
cluster logs to <out-dir>/cluster-<mode>/logs; a progress bar goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _goodput_report import Goodput, Progress, RateSearch, at_least, goodput, plot  # noqa: E402
from _goodput_run import (  # noqa: E402
    REQUEST_DEADLINE_S,
    Isolated,
    PointResult,
    Router,
    Slo,
    measure_isolated,
    run_point,
    score,
    warm_up,
)
from _goodput_workload import Workload, describe, request_classes, trace, workloads  # noqa: E402

from runtime.engine.presets import preset_config  # noqa: E402
from tooling.cluster.launcher import ClusterSpec, LocalCluster  # noqa: E402

MODES = ("colocated", "disaggregated", "auto")
"""Colocated first: it is the baseline of every ratio, and calibration runs on it."""

CLUSTER_ENV = {
    # One compute thread per worker (the launcher also passes --torch-threads).
    "PD_TORCH_THREADS": "1",
    # Overloaded rate points queue prefills for tens of seconds; the default
    # 60 s timeouts would turn that queueing into retries, which changes the
    # load being measured. A request that waits this long fails its SLO anyway.
    "PD_ROUTER_PREFILL_TIMEOUT_S": "120",
    "PD_ROUTER_FIRST_TOKEN_TIMEOUT_S": "120",
}


class Output:
    """JSON lines to stdout and to a file."""

    def __init__(self, path: Path):
        self.file = open(path, "w")

    def emit(self, kind: str, **row) -> None:
        line = json.dumps({"bench": "goodput", "kind": kind, **row})
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: shorter long prompts, few requests, 2 rates per sweep")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--workers", type=int, default=2, help="worker processes per cluster, every mode")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--workloads", default="long,short,mixed")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--ttft-slo-x", type=float, default=5.0,
                    help="TTFT SLO = this x single-request TTFT of the class's median prompt")
    ap.add_argument("--tpot-slo-x", type=float, default=2.0,
                    help="TPOT SLO = this x single-request TPOT of the class's median request")
    ap.add_argument("--target", type=float, default=0.9, help="joint attainment that counts as good")
    ap.add_argument("--max-points", type=int, default=None, help="rates per sweep (4; quick 2)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall-clock budget of the whole run (1140; quick 330)")
    ap.add_argument("--calibration-repeats", type=int, default=None, help="(3; quick 1)")
    ap.add_argument("--num-blocks", type=int, default=2048, help="K/V blocks per worker")
    ap.add_argument("--auto-workers", choices=("mixed", "split"), default="mixed",
                    help="auto's cluster: every worker mixed (default), or half prefill + half decode")
    ap.add_argument("--transport", default=ClusterSpec().transport,
                    help="K/V hand-off transport (default: the launcher's, %(default)s)")
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "out"))
    args = ap.parse_args()
    args.max_points = args.max_points or (2 if args.quick else 4)
    args.budget_s = args.budget_s or (330.0 if args.quick else 1140.0)
    args.calibration_repeats = args.calibration_repeats or (1 if args.quick else 3)
    return args


def auto_accepted() -> bool:
    """Does this tree's router accept `auto` as its default mode?"""
    from router.config import MODES as ROUTER_MODES
    return "auto" in ROUTER_MODES


def cluster_spec(mode: str, args: argparse.Namespace, out_dir: Path) -> ClusterSpec:
    """Colocated: every worker a decode worker (they prefill too); disaggregated: half
    prefill, half decode; auto: every worker mixed (serves either phase or both), so
    each request's choice of colocated W or split (P, D) can use any of them."""
    n = args.workers
    if mode == "colocated":
        prefill, decode, mixed = 0, n, 0
    elif mode == "auto" and args.auto_workers == "mixed":
        prefill, decode, mixed = 0, 0, n
    else:
        prefill, decode, mixed = n // 2, n - n // 2, 0
    return ClusterSpec(
        prefill=prefill, decode=decode, mixed=mixed, model=args.preset, mode=mode,
        num_blocks=args.num_blocks, transport=args.transport, torch_threads=1,
        # Generous leases and reservations: a starved heartbeat or a long prefill
        # queue under overload must show up as latency, not as aborts and retries.
        lease_ttl_s=10.0, reservation_ttl_s=120.0,
        state_dir=str(out_dir / f"cluster-{mode}"), env={**CLUSTER_ENV, "PD_ROUTER_MODE": mode})


SHARE_WEIGHT = {"long": 2.0, "short": 2.0, "mixed": 0.5}
"""Budget weight of a workload's sweeps: the workloads the targets are about
(`long`, `short`) four times `mixed`'s. Without weights the long sweeps, whose points
cost a minute or two each, stopped after one point in every mode; with short at 1,
colocated's short sweep ran out before it found a failing rate (a lower bound that
decides no comparison)."""


def start_rate(w: Workload, iso: dict[str, Isolated]) -> float:
    """First rate of a sweep: 1 / (mean burst x mean unloaded prefill s + mean decode s at an
    assumed batch of 4). A burst's prompts arrive together and the last one's first token
    waits for the prefills ahead of it, so a bursty workload's knee is about a burst's
    prefill time lower than a Poisson one's (its sweeps used to start past every mode's
    knee and spend half their budget on a point that only said "too fast")."""
    prefill_s = w.mean_burst * sum(p * iso[c].ttft_ms for c, p in w.mix) / 1000
    decode_s = sum(p * iso[c].output_tokens * iso[c].tpot_ms for c, p in w.mix) / 1000 / 4
    return 1.0 / (prefill_s + decode_s)


def drain_s(w: Workload, classes, iso: dict[str, Isolated]) -> float:
    """Rough time for the last request to finish after it arrives (budget estimates only)."""
    return max(1.5 * (iso[c].ttft_ms + classes[c].output_tokens[1] * iso[c].tpot_ms) / 1000
               for c, _ in w.mix)


def _workers_text(mode: str, args) -> str:
    spec = cluster_spec(mode, args, Path(args.out_dir))
    if mode == "colocated":
        return f"0 prefill + {spec.decode} decode (colocated on decode workers)"
    if spec.mixed:
        return f"{spec.mixed} mixed (decode workers that also serve Prefill)"
    return f"{spec.prefill} prefill + {spec.decode} decode"


def config_row(args, classes, wls, modes, skipped) -> dict:
    spec = cluster_spec("disaggregated", args, Path(args.out_dir))
    return {
        "quick": args.quick, "preset": args.preset, "seed": args.seed,
        "workers_per_mode": {m: _workers_text(m, args) for m in modes},
        "modes_skipped": skipped,
        "workloads": {name: describe(w, classes) for name, w in wls.items()},
        "slo_rule": {"ttft": f"{args.ttft_slo_x} x single-request TTFT at the class's median lengths",
                     "tpot": f"{args.tpot_slo_x} x single-request TPOT at the class's median lengths",
                     "measured_on": f"{modes[0]} cluster, {args.calibration_repeats} repeat(s), median"},
        "target_joint_attainment": args.target,
        "search": {"start": ("1 / (mean burst x mean single-request TTFT + mean output x TPOT / 4), "
                             "same for every mode"),
                   "factor": 2.0, "resolution": 1.15, "max_points_per_sweep": args.max_points,
                   "goodput": "interpolated between the highest passing and the next failing rate"},
        "sizing": ("quick smoke run: long prompts 512-1024 (outputs 32-64), 3-4 requests per rate, "
                   "2 rates per sweep; numbers are not meaningful" if args.quick else
                   "2 cores shared by 2 workers, router, directory and client: a 2k-token prefill takes "
                   "~2 s, so long prompts stay 1024-2048 (8x outputs of 64-128), 12 long / 40 short / "
                   "16 mixed requests per rate (>= 90% allows 1, 4, 1 misses; a short point is cheap, "
                   "so it gets the larger sample), up to 4 rates per sweep, "
                   "each sweep's share of the budget in proportion to its estimated point time x its weight "
                   f"{SHARE_WEIGHT} (the targets are about long and short)"),
        "budget_s": args.budget_s, "request_deadline_s": REQUEST_DEADLINE_S,
        "cluster": {"torch_threads": spec.torch_threads, "num_blocks": spec.num_blocks,
                    "block_size": spec.block_size, "chunk_tokens": spec.chunk_tokens,
                    "transport": spec.transport, "lease_ttl_s": spec.lease_ttl_s,
                    "reservation_ttl_s": spec.reservation_ttl_s, "env": CLUSTER_ENV},
    }


class Bench:
    """One run: clusters one after another, calibration on the first, sweeps on each."""

    def __init__(self, args: argparse.Namespace, modes: list[str], out: Output):
        self.args, self.modes, self.out = args, modes, out
        self.classes = request_classes(args.quick)
        all_w = workloads(args.quick)
        self.workloads = {n: all_w[n] for n in args.workloads.split(",")}
        self.vocab = preset_config(args.preset).vocab_size
        self.loop = asyncio.new_event_loop()
        self.t0 = time.monotonic()
        self.run_deadline = self.t0 + args.budget_s - 15.0
        """Last moment a rate point may end (leaves time to stop the cluster and plot)."""
        self.cluster_cost_s = 45.0  # replaced by the first cluster's measured start + stop
        self.slo: Slo | None = None
        self.iso: dict[str, Isolated] = {}
        self.results: dict[str, dict[str, list[PointResult]]] = {w: {} for w in self.workloads}
        units = len(modes) * (1 + len(self.workloads) * args.max_points) + 1
        self.progress = Progress(units)

    def run(self) -> None:
        for i, mode in enumerate(self.modes):
            self.run_mode(mode, remaining_modes=len(self.modes) - i)
        self.progress.close()

    def run_mode(self, mode: str, remaining_modes: int) -> None:
        if time.monotonic() + self.cluster_cost_s > self.run_deadline:
            self.out.emit("note", mode=mode, note="budget: skipped the mode (no time left to start its cluster)")
            self.progress.step(1 + len(self.workloads) * self.args.max_points)
            return
        self.progress.update(f"{mode}: starting cluster")
        t = time.monotonic()
        cluster = LocalCluster(cluster_spec(mode, self.args, Path(self.args.out_dir)))
        try:
            router = Router(cluster.up(), cluster.client_files())  # its certificate, not the cwd's
        except Exception as e:
            if mode != "auto":
                raise
            self.out.emit("note", mode=mode, note=f"skipped: the cluster did not start in auto mode ({e})")
            self.progress.step(1 + len(self.workloads) * self.args.max_points)
            return
        try:
            self.loop.run_until_complete(warm_up(router, self.vocab, self.args.seed, self.args.workers))
            if self.slo is None:
                self.cluster_cost_s = time.monotonic() - t + 10.0  # start + warm-up, plus a stop
                self.calibrate(router)
            self.progress.step(1, f"{mode}: cluster up")
            names = list(self.workloads)
            for j, name in enumerate(names):
                left = names[j:] + names * (remaining_modes - 1)
                self.sweep(router, mode, name, left, remaining_modes - 1)
        finally:
            cluster.down()

    def calibrate(self, router: Router) -> None:
        self.progress.update("calibrating single-request latencies")
        a = self.args
        used = sorted({c for w in self.workloads.values() for c, _ in w.mix})
        for c in used:
            self.iso[c] = self.loop.run_until_complete(measure_isolated(
                router, self.classes[c], self.vocab, a.calibration_repeats, a.seed))
        self.slo = Slo(ttft_ms={c: a.ttft_slo_x * self.iso[c].ttft_ms for c in used},
                       tpot_ms={c: a.tpot_slo_x * self.iso[c].tpot_ms for c in used})
        self.out.emit("slo", measured_on=self.modes[0], single_request={c: asdict(i) for c, i in self.iso.items()},
                      ttft_slo_ms={c: round(v, 1) for c, v in self.slo.ttft_ms.items()},
                      tpot_slo_ms={c: round(v, 2) for c, v in self.slo.tpot_ms.items()},
                      start_rate_rps={n: round(start_rate(w, self.iso), 3) for n, w in self.workloads.items()})
        self.progress.step(1, "calibrated")

    def point_estimate_s(self, name: str, rate: float) -> float:
        """Rough wall time of one rate point: the arrival span plus the last request's service."""
        w = self.workloads[name]
        span = (w.requests_per_rate - 1) / rate  # arrival_times spans n - 1 units
        return span + drain_s(w, self.classes, self.iso)

    def sweep_deadlines(self, name: str, sweeps_left: list[str], clusters_left: int) -> tuple[float, float]:
        """(soft, hard): soft = this sweep's share of what remains of the budget, in
        proportion to its estimated cost (a point at the start rate) times its
        workload's SHARE_WEIGHT among the sweeps left; hard = the budget's end less
        the clusters still to start."""
        cost = {n: SHARE_WEIGHT.get(n, 1.0) * self.point_estimate_s(n, start_rate(self.workloads[n], self.iso))
                for n in set(sweeps_left)}
        hard = self.run_deadline - clusters_left * self.cluster_cost_s
        share = cost[name] / sum(cost[n] for n in sweeps_left)
        return time.monotonic() + max(0.0, hard - time.monotonic()) * share, hard

    def sweep(self, router: Router, mode: str, name: str, sweeps_left: list[str], clusters_left: int) -> None:
        w, a = self.workloads[name], self.args
        soft, hard = self.sweep_deadlines(name, sweeps_left, clusters_left)
        search = RateSearch(start_rate(w, self.iso))
        points: list[PointResult] = []
        while len(points) < a.max_points:
            rate = search.next_rate()
            if rate is None:
                break
            requests = trace(w, self.classes, a.seed, self.vocab, salt=len(points))
            estimate_s = self.point_estimate_s(name, rate)
            # A sweep's first point may use the slack of the others; later ones only its share.
            late = time.monotonic() + estimate_s > (soft if points else hard)
            if late:
                what = "stopped the sweep" if points else "skipped the sweep"
                self.out.emit("note", workload=name, mode=mode,
                              note=f"budget: {what} before {rate:.3f} rps (~{estimate_s:.0f} s)")
                break
            text = f"{name}/{mode} {rate:.3f} rps"
            self.progress.update(text)
            t = time.monotonic()
            outcomes = self.loop.run_until_complete(run_point(
                router, requests, rate, self.slo,
                max(estimate_s, min(max(2 * estimate_s, estimate_s + 30), hard - time.monotonic())),
                lambda done: self.progress.update(f"{text} {done}/{len(requests)} req", done / len(requests))))
            point = score(rate, outcomes, self.slo, time.monotonic() - t)
            search.record(rate, point.passed(a.target))
            points.append(point)
            self.out.emit("rate", workload=name, mode=mode, **_rounded(asdict(point)),
                          passed=point.passed(a.target))
            self.progress.step(1)
        self.progress.step(a.max_points - len(points))
        self.results[name][mode] = points

    def summarize(self) -> dict[str, dict[str, Goodput]]:
        target = self.args.target
        table = {w: {m: goodput(pts, target) for m, pts in by_mode.items()} for w, by_mode in self.results.items()}
        for w, by_mode in table.items():
            base = by_mode.get("colocated")
            for m, g in by_mode.items():
                ratio = (g.goodput_rps / base.goodput_rps) if base and base.goodput_rps > 0 else None
                self.out.emit("goodput", workload=w, mode=m, goodput_rps=round(g.goodput_rps, 4),
                              ratio_vs_colocated=None if ratio is None else round(ratio, 3),
                              goodput_method=g.method, highest_passing_rps=_r(g.highest_passing_rps),
                              lowest_failing_above_rps=_r(g.lowest_failing_above_rps),
                              rates_tested=len(self.results[w][m]))
        self.check_targets(table)
        return table

    def check_targets(self, table: dict[str, dict[str, Goodput]]) -> None:
        """The targets (docs/benchmarks.md, Goodput), judged on the sweeps' bounds
        (`at_least`): `met` is true, false, or null when the sweeps do not decide it (`why` says)."""
        long = table.get("long", {})
        if "colocated" in long and "disaggregated" in long:
            c, d = long["colocated"], long["disaggregated"]
            met, why = at_least(d, c, 1.5)
            self.out.emit("target", target="disaggregated >= 1.5x colocated on long",
                          value=round(d.goodput_rps / c.goodput_rps, 3) if c.goodput_rps else None, met=met, why=why)
        for w in ("long", "short"):
            by = table.get(w, {})
            if not all(m in by for m in ("colocated", "disaggregated", "auto")):
                continue
            verdicts = [at_least(by["auto"], by[m], 0.95) for m in ("colocated", "disaggregated")]
            met = False if False in (v for v, _ in verdicts) else None if None in (v for v, _ in verdicts) else True
            best = max(by["colocated"].goodput_rps, by["disaggregated"].goodput_rps)
            self.out.emit("target", target=f"auto >= 0.95x the better of the two on {w}",
                          value=round(by["auto"].goodput_rps / best, 3) if best else None, met=met,
                          why="; ".join(f"vs {m}: {why}"
                                        for m, (_, why) in zip(("colocated", "disaggregated"), verdicts) if why))


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _rounded(row: dict) -> dict:
    """Floats to 4 decimals; NaN (a quantile of no completed request) to null, which JSON can carry."""
    return {k: ((None if v != v else round(v, 4)) if isinstance(v, float) else v) for k, v in row.items()}


def main() -> None:
    args = parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = Output(out_dir / "goodput.jsonl")
    modes, skipped = [], {}
    wanted = args.modes.split(",")
    unknown = set(wanted) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown modes {sorted(unknown)}; choose from {MODES}")
    for m in sorted(wanted, key=MODES.index):  # colocated first: baseline and calibration
        if m == "auto" and not auto_accepted():
            skipped[m] = "router.config.MODES has no 'auto' yet (RouterConfig rejects it)"
        else:
            modes.append(m)
    bench = Bench(args, modes, out)
    out.emit("config", **config_row(args, bench.classes, bench.workloads, modes, skipped))
    for m, why in skipped.items():
        out.emit("note", mode=m, note=f"skipped: {why}")
    bench.run()
    table = bench.summarize()
    png = out_dir / "goodput.png"
    a = args
    subtitle = (f"{a.preset} preset, {a.workers} workers per mode, SLO: TTFT {a.ttft_slo_x}x, TPOT "
                f"{a.tpot_slo_x}x single-request; target {a.target:.0%} joint"
                + (" (quick smoke run)" if a.quick else ""))
    why = plot(str(png), bench.results, table, a.target, subtitle)
    out.emit("note", note=why or f"plot: {png}", wall_s=round(time.monotonic() - bench.t0, 1))


if __name__ == "__main__":
    main()
