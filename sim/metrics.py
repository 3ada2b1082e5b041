"""What a simulated run measured: per request (`RequestResult`) and per run
(`RunResult`: attainment of each target and of both, routes, utilisation per pool), and
goodput: the highest arrival rate at which at least `share` of the requests meet both
targets (`goodput_search`), per GPU where a profile says how many GPUs a worker spans.

A rejected or unserved request meets no target. A request of one output token has no
TPOT and meets that target vacuously.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

ATTAINMENT = 0.9
"""Goodput's share of requests that must meet both targets (DistServe's 90%)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RequestResult:
    """One request's fate."""

    index: int
    arrival_ms: float
    prompt_tokens: int
    output_tokens: int
    route: str
    """colocated, disaggregated, rejected (auto mode refused it), unserved (it never fit)."""
    ttft_ms: float
    tpot_ms: float
    queue_ms: float
    """Arrival to dispatch: the wait for K/V room."""
    predicted_ttft_ms: float
    predicted_tpot_ms: float
    prefill_worker: str
    decode_worker: str
    kind: str = ""
    first_gap_ms: float = math.nan
    """Token 0 to token 1 (a split route's hand-off is in it)."""

    @property
    def served(self) -> bool:
        return self.route in ("colocated", "disaggregated")

    def meets(self, slo_ttft_ms: float, slo_tpot_ms: float) -> tuple[bool, bool]:
        """(TTFT met, TPOT met); 0 = no target."""
        if not self.served:
            return False, False
        ttft = slo_ttft_ms <= 0 or self.ttft_ms <= slo_ttft_ms
        tpot = slo_tpot_ms <= 0 or self.output_tokens <= 1 or self.tpot_ms <= slo_tpot_ms
        return ttft, tpot


@dataclasses.dataclass(frozen=True, slots=True)
class RunResult:
    """One replay's results."""

    requests: tuple[RequestResult, ...]
    slo_ttft_ms: float
    slo_tpot_ms: float
    rate_rps: float
    gpus: int
    routes: dict[str, int]
    utilisation: dict[str, float]
    """Per role (prefill, decode, mixed): busy time over the run's span, averaged over its workers."""
    cpu_s: float
    """Process CPU time the simulation took."""
    decision_us: float
    """Mean router decision time per arrival (the Planner's plan)."""
    span_ms: float = 0.0
    """From the first arrival to the last completion."""
    workers: dict[str, int] = dataclasses.field(default_factory=dict)
    """Workers per role."""

    def attainment(self) -> dict[str, float]:
        """Shares of all requests meeting the TTFT target, the TPOT target and both."""
        if not self.requests:
            return {"ttft": 0.0, "tpot": 0.0, "both": 0.0}
        met = [r.meets(self.slo_ttft_ms, self.slo_tpot_ms) for r in self.requests]
        n = len(met)
        return {"ttft": sum(a for a, _ in met) / n, "tpot": sum(b for _, b in met) / n,
                "both": sum(a and b for a, b in met) / n}

    def quantiles(self, field: str, qs: Sequence[float] = (0.5, 0.9, 0.99)) -> dict[str, float]:
        """Quantiles of `field` (ttft_ms, tpot_ms, queue_ms) over served requests."""
        xs = [getattr(r, field) for r in self.requests if r.served and (field != "tpot_ms" or r.output_tokens > 1)]
        if not xs:
            return {f"p{int(q * 100)}": math.nan for q in qs}
        v = np.quantile(np.asarray(xs, dtype=float), qs)
        return {f"p{int(q * 100)}": float(x) for q, x in zip(qs, v)}

    def summary(self) -> dict:
        """One JSON-able line."""
        return {"rate_rps": round(self.rate_rps, 4), "requests": len(self.requests), "gpus": self.gpus,
                "attainment": {k: round(v, 4) for k, v in self.attainment().items()}, "routes": self.routes,
                "ttft_ms": _rounded(self.quantiles("ttft_ms")), "tpot_ms": _rounded(self.quantiles("tpot_ms")),
                "queue_ms": _rounded(self.quantiles("queue_ms")),
                "utilisation": {k: round(v, 3) for k, v in self.utilisation.items()},
                "cpu_s": round(self.cpu_s, 3), "decision_us": round(self.decision_us, 1)}


def _rounded(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) if math.isfinite(v) else None for k, v in d.items()}


@dataclasses.dataclass(frozen=True, slots=True)
class Goodput:
    """The result of a rate search."""

    goodput_rps: float
    """Highest rate found with attainment >= the share (0: not even the lowest tried)."""
    points: tuple[tuple[float, float], ...]
    """(rate, attainment of both) of every rate tried, ascending by rate."""
    at_goodput: RunResult | None
    """The run at the goodput rate."""
    first_miss: RunResult | None
    """The run at the lowest rate tried that missed (what binds there)."""


def goodput_search(run_at: Callable[[float], RunResult], start_rps: float, share: float = ATTAINMENT,
                   rel_tol: float = 0.03, max_runs: int = 24, ceiling: float = 64.0) -> Goodput:
    """Highest rate with attainment(both) >= share: grow (x2) or shrink (/2) from `start_rps`
    to bracket it, then bisect to `rel_tol`. Attainment is taken as falling with rate
    (noise aside: the simulation is deterministic for a given seed). The search stops
    growing at `ceiling` x `start_rps`: past it a finite workload is one burst, and its
    attainment says how the cluster drains a burst, not what rate it sustains."""
    tried: dict[float, RunResult] = {}

    def ok(rate: float) -> bool:
        if rate not in tried:
            tried[rate] = run_at(rate)
        return tried[rate].attainment()["both"] >= share

    lo, hi = 0.0, start_rps
    while ok(hi) and len(tried) < max_runs:
        if hi * 2 > ceiling * start_rps:
            return Goodput(hi, tuple((r, tried[r].attainment()["both"]) for r in sorted(tried)), tried[hi], None)
        lo, hi = hi, hi * 2
    if lo == 0.0:
        while not ok(hi) and len(tried) < max_runs and hi > start_rps / 1024:
            hi /= 2
        if ok(hi):
            lo, hi = hi, hi * 2
    while lo > 0 and hi - lo > rel_tol * lo and len(tried) < max_runs:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    misses = [r for rate, r in sorted(tried.items()) if rate > lo and r.attainment()["both"] < share]
    return Goodput(lo, tuple((rate, tried[rate].attainment()["both"]) for rate in sorted(tried)),
                   tried.get(lo), misses[0] if misses else None)
