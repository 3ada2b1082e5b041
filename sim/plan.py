"""The placement planner behind `pdctl plan`: for a workload, two targets, a GPU budget
and a profile, which counts of prefill, decode and mixed workers (and which tensor
parallel degree, where the profile has several) give the most goodput per GPU, and why.

Every number comes from the simulator (sim/cluster.py) running the router's own
decision code. A configuration is judged by its goodput (sim/metrics.py
`goodput_search`): the highest rate of the workload, its arrival gaps scaled, at which
at least 90% of requests meet both targets. The search per parallel degree t
(W = gpus // t workers):

    colocated       W mixed workers, the router in colocated mode (the baseline)
    disaggregated   p prefill + (W - p) decode, disaggregated mode; p over a coarse
                    grid, then the neighbours of the best
    auto            the router's per-request choice (auto mode) on W mixed workers, on
                    the best disaggregated split, and on that split with its decode
                    workers mixed (they then serve colocated requests and prefill too)

`least_gpus` answers the autoscaler's question instead: the fewest GPUs whose best
configuration meets both targets (attainment >= 90%) at a given rate.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from sim.cluster import ClusterSpec, Simulation
from sim.metrics import ATTAINMENT, Goodput, RunResult, goodput_search
from sim.profile import SimProfile
from sim.workload import Workload


def load_profiles(name_or_path: str) -> list[SimProfile]:
    """A saved profile file (one profile), or a built-in analytic name (sim/gpu.py): with a
    tensor parallel degree (`h100-llama3-8b-tp2`) one profile, without one every degree
    that fits (`h100-llama3-8b`)."""
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        if not p.exists():
            raise ValueError(f"profile file {name_or_path!r} does not exist")
        return [SimProfile.load(p)]
    from sim import gpu

    try:
        return [gpu.gpu_profile(name_or_path)]
    except ValueError:
        return gpu.gpu_family(name_or_path)


def load_profile(name_or_path: str) -> SimProfile:
    """One profile: a file, or a built-in name (without a degree: the smallest that fits)."""
    return min(load_profiles(name_or_path), key=lambda p: p.gpus)


MIN_SPAN_S = 20.0
"""Each simulated run's arrivals span at least this long (the sample repeated: Workload.spanning):
a thousand requests at 10,000 rps arrive in 0.1 s, a burst whose attainment says nothing
about the rate the cluster sustains. The cost: a run simulates rate x 20 s requests at least."""


@dataclasses.dataclass(frozen=True, slots=True)
class Configuration:
    """One candidate deployment and what the simulator measured of it."""

    prefill: int
    decode: int
    mixed: int
    mode: str
    """The router mode it runs (colocated, disaggregated, auto)."""
    profile: str
    gpus_per_worker: int
    goodput_rps: float
    why: str = ""
    points: tuple[tuple[float, float], ...] = ()
    """(rate, attainment of both targets) of every rate the search tried."""

    @property
    def gpus(self) -> int:
        return (self.prefill + self.decode + self.mixed) * self.gpus_per_worker

    @property
    def goodput_per_gpu(self) -> float:
        return self.goodput_rps / self.gpus if self.gpus else 0.0

    def label(self) -> str:
        return f"{ClusterSpec(self.prefill, self.decode, self.mixed).label()} {self.mode} ({self.profile})"

    def to_dict(self) -> dict:
        return {"prefill": self.prefill, "decode": self.decode, "mixed": self.mixed, "mode": self.mode,
                "profile": self.profile, "gpus": self.gpus, "gpus_per_worker": self.gpus_per_worker,
                "goodput_rps": round(self.goodput_rps, 4), "goodput_per_gpu": round(self.goodput_per_gpu, 4),
                "why": self.why, "points": [[round(r, 4), round(a, 4)] for r, a in self.points]}


@dataclasses.dataclass(frozen=True, slots=True)
class Targets:
    """The request targets and the goodput share."""

    slo_ttft_ms: float
    slo_tpot_ms: float
    share: float = ATTAINMENT


def explain(run: RunResult | None, t: Targets) -> str:
    """Which target binds and which pool saturates, from the first rate that missed."""
    if run is None:
        return "no rate tried missed the targets (the search's ceiling bound it)"
    a = run.attainment()
    busiest = max(run.utilisation.items(), key=lambda kv: kv[1]) if run.utilisation else ("?", 0.0)
    binds = "TTFT" if a["ttft"] < a["tpot"] else "TPOT"
    rejected = run.routes.get("rejected", 0) + run.routes.get("unserved", 0)
    extra = f", {rejected} of {len(run.requests)} refused" if rejected else ""
    return (f"at {run.rate_rps:.3g} rps {binds} binds (TTFT met by {a['ttft']:.0%}, TPOT by {a['tpot']:.0%}"
            f"{extra}); the {busiest[0]} pool is busiest ({busiest[1]:.0%} busy), "
            f"p90 TTFT {run.quantiles('ttft_ms')['p90']:.0f} ms, p90 TPOT {run.quantiles('tpot_ms')['p90']:.1f} ms")


def capacity_guess(workload: Workload, profile: SimProfile, workers: int) -> float:
    """A rough rate the workers can sustain (to start the rate search near it): the lower of
    the prefill bound and a decode bound at a modest batch."""
    e = profile.engine
    prompts, outputs = workload.lengths()
    prefill = statistics.fmean(e.prefill_ms(min(p, e.max_prefill_tokens), 0) * -(-p // e.max_prefill_tokens)
                               for p in prompts[:2000])
    batch = min(64, e.max_decode_batch)
    ctx = statistics.fmean(prompts[:2000]) + statistics.fmean(outputs[:2000]) / 2
    per_token = e.decode_step_ms(batch, int(batch * ctx)) / batch
    decode = statistics.fmean(outputs[:2000]) * per_token
    return max(1e-3, 0.5 * workers * 1000.0 / (prefill + decode))


class Planner:
    """Simulates configurations of one workload and keeps what it measured."""

    def __init__(self, workload: Workload, targets: Targets, rel_tol: float = 0.04,
                 progress: Callable[[str], None] | None = None, min_span_s: float = MIN_SPAN_S, **router_overrides):
        self.workload = workload
        self.targets = targets
        self.rel_tol = rel_tol
        self.min_span_s = min_span_s
        self.progress = progress or (lambda _msg: None)
        self.router_overrides = router_overrides
        self.runs = 0

    def simulate(self, spec: ClusterSpec, profile: SimProfile, mode: str, rate: float) -> RunResult:
        """One replay at `rate`."""
        self.runs += 1
        sim = Simulation(spec, profile, mode, self.targets.slo_ttft_ms, self.targets.slo_tpot_ms,
                         **self.router_overrides)
        return sim.run(self.workload.scaled(rate).spanning(self.min_span_s))

    def goodput(self, spec: ClusterSpec, profile: SimProfile, mode: str) -> Configuration:
        """`spec`'s goodput under `mode`."""
        start = capacity_guess(self.workload, profile, spec.workers)
        g: Goodput = goodput_search(lambda r: self.simulate(spec, profile, mode, r), start, self.targets.share,
                                    self.rel_tol)
        c = Configuration(spec.prefill, spec.decode, spec.mixed, mode, profile.name, profile.gpus, g.goodput_rps,
                          explain(g.first_miss, self.targets), g.points)
        self.progress(f"{c.label()}: goodput {c.goodput_rps:.3g} rps ({c.goodput_per_gpu:.3g}/GPU)")
        return c

    def colocated(self, profile: SimProfile, workers: int) -> Configuration:
        return self.goodput(ClusterSpec(mixed=workers), profile, "colocated")

    def disaggregated(self, profile: SimProfile, workers: int, mode: str = "disaggregated") -> list[Configuration]:
        """Every p of a coarse grid of prefill counts, then the neighbours of the best."""
        if workers < 2:
            return []
        seen: dict[int, Configuration] = {}

        def at(p: int) -> Configuration:
            if p not in seen:
                seen[p] = self.goodput(ClusterSpec(prefill=p, decode=workers - p), profile, mode)
            return seen[p]

        grid = sorted({max(1, min(workers - 1, round(workers * f))) for f in (0.2, 0.35, 0.5, 0.65)})
        for p in grid:
            at(p)
        step = max(1, (grid[1] - grid[0]) // 2 if len(grid) > 1 else 1)
        while True:  # hill-climb from the best, halving the step once it holds
            best = max(seen.values(), key=lambda c: c.goodput_rps).prefill
            for p in (best - step, best + step):
                if 1 <= p < workers:
                    at(p)
            if max(seen.values(), key=lambda c: c.goodput_rps).prefill == best:
                if step == 1:
                    break
                step //= 2
        return sorted(seen.values(), key=lambda c: -c.goodput_rps)

    def plan(self, profiles: Iterable[SimProfile], gpus: int) -> Plan:
        """The best configurations within `gpus`, per parallel degree, and the colocated baseline."""
        configs: list[Configuration] = []
        for profile in profiles:
            workers = gpus // profile.gpus
            if workers < 1:
                continue
            configs.append(self.colocated(profile, workers))
            split = self.disaggregated(profile, workers)
            configs += split
            configs.append(self.goodput(ClusterSpec(mixed=workers), profile, "auto"))
            if split:  # the per-request choice on the best split, and with its decode pool mixed
                best = split[0]
                configs.append(self.goodput(ClusterSpec(best.prefill, best.decode), profile, "auto"))
                configs.append(self.goodput(ClusterSpec(best.prefill, 0, best.decode), profile, "auto"))
        if not configs:
            raise ValueError(f"no profile fits {gpus} GPU(s)")
        return Plan(tuple(sorted(configs, key=lambda c: -c.goodput_per_gpu)), self.targets, gpus, self.runs)


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """The planner's answer."""

    configurations: tuple[Configuration, ...]
    """Best first (goodput per GPU)."""
    targets: Targets
    gpus: int
    runs: int
    """Simulations it took."""

    def best(self, mode: str | None = None) -> Configuration | None:
        return next((c for c in self.configurations if mode is None or c.mode == mode), None)

    def verdict(self) -> str:
        """Which wins, by how much, and why (the loser's binding target and busiest pool)."""
        col, top = self.best("colocated"), self.best()
        dis = self.best("disaggregated")
        if top is None or col is None:
            return "no configuration was measured"
        if top.goodput_per_gpu <= 0:
            return "no configuration meets the targets at any rate tried: loosen them or add GPUs"
        ratio = top.goodput_per_gpu / col.goodput_per_gpu if col.goodput_per_gpu > 0 else math.inf
        if top.mode == "colocated" or ratio < 1.0 + 1e-9:
            why = f"disaggregated: {dis.why}" if dis else "no split configuration fits"
            return (f"colocated wins ({col.label()}, {col.goodput_per_gpu:.3g} rps/GPU); the best split loses "
                    f"because {why}")
        return (f"{top.mode} wins: {top.label()} gives {ratio:.2f}x the colocated goodput per GPU "
                f"({top.goodput_per_gpu:.3g} vs {col.goodput_per_gpu:.3g} rps/GPU); colocated stops because {col.why}")

    def to_dict(self, top: int = 5) -> dict:
        col = self.best("colocated")
        return {"gpus": self.gpus, "slo_ttft_ms": self.targets.slo_ttft_ms, "slo_tpot_ms": self.targets.slo_tpot_ms,
                "attainment": self.targets.share, "simulations": self.runs,
                "configurations": [c.to_dict() for c in self.configurations[:top]],
                "colocated": col.to_dict() if col else None,
                "best_by_mode": {m: (c.to_dict() if c else None) for m in ("colocated", "disaggregated", "auto")
                                 for c in [self.best(m)]},
                "verdict": self.verdict()}


def least_gpus(workload: Workload, slo_ttft_ms: float, slo_tpot_ms: float, profile: SimProfile | str,
               max_gpus: int, share: float = ATTAINMENT, bounds: Mapping[str, tuple[int, int]] | None = None,
               **router_overrides) -> Configuration | None:
    """The configuration with the fewest GPUs (at most `max_gpus`) whose attainment of both
    targets is at least `share` at the workload's own rate; None when none within the
    budget does. `bounds`: (fewest, most) workers per pool (prefill, decode, mixed) the
    deployment has; a pool not named is free. Tried per worker count (binary search: more
    workers never serve less): all colocated (mixed workers, or decode workers, which serve
    colocated requests too), auto on mixed workers, and a few prefill/decode splits."""
    profile = load_profile(profile) if isinstance(profile, str) else profile
    planner = Planner(workload, Targets(slo_ttft_ms, slo_tpot_ms, share), **router_overrides)
    rate = max(workload.rate_rps, 1e-6)
    b = {pool: (bounds or {}).get(pool, (0, 1 << 30)) for pool in ("prefill", "decode", "mixed")}

    def best_at(workers: int) -> Configuration | None:
        for spec, mode in _candidates(workers, b):
            run = planner.simulate(spec, profile, mode, rate)
            if run.attainment()["both"] >= share:
                return Configuration(spec.prefill, spec.decode, spec.mixed, mode, profile.name, profile.gpus, rate,
                                     f"meets both targets for {run.attainment()['both']:.0%} of requests at "
                                     f"{rate:.3g} rps")
        return None

    lo = max(1, sum(low for low, _ in b.values()))
    hi = min(max_gpus // profile.gpus, sum(high for _, high in b.values()))
    if hi < lo or (found := best_at(hi)) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        c = best_at(mid)
        if c is not None:
            hi, found = mid, c
        else:
            lo = mid + 1
    return found


def _candidates(workers: int, b: Mapping[str, tuple[int, int]]) -> list[tuple[ClusterSpec, str]]:
    """The shapes `least_gpus` tries at `workers` workers, within the pools' bounds."""
    def fits(p: int, d: int, m: int) -> bool:
        return all(lo <= n <= hi for n, (lo, hi) in zip((p, d, m), (b["prefill"], b["decode"], b["mixed"]))) \
            and d + m >= 1

    out = []
    if fits(0, 0, workers):
        out += [(ClusterSpec(mixed=workers), "colocated"), (ClusterSpec(mixed=workers), "auto")]
    elif fits(0, workers, 0):
        out.append((ClusterSpec(decode=workers), "colocated"))
    for p in sorted({round(workers * f) for f in (0.25, 0.5)} | {b["prefill"][0]}):
        if 1 <= p < workers and fits(p, workers - p, 0):
            out.append((ClusterSpec(prefill=p, decode=workers - p), "auto"))
    return out
