"""Goodput benchmark: send a trace through the router and score it against SLOs.

Everything is measured client-side with the SDK (`AsyncClient`): TTFT is the
time from the `generate` call to the first token, TPOT = (latency - TTFT) /
(output tokens - 1). A request that fails (rejected, timed out, any error)
meets no SLO.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from _goodput_workload import Request, RequestClass, random_prompt

from pdserve_client import AsyncClient
from pdserve_client.tls import TlsFiles
from pdserve_client.types import PdError, client_tpot_ms

REQUEST_DEADLINE_S = 120.0
"""Router-side time budget of every benchmark request (the router's default)."""


@dataclass(frozen=True, slots=True)
class Slo:
    """Per request class: TTFT and TPOT objectives, ms."""

    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the client saw for one request."""

    cls: str
    ttft_ms: float
    tpot_ms: float
    num_tokens: int
    route: str
    """'disaggregated', 'colocated', or 'error:<CODE>'."""
    start_lag_ms: float
    """How late the client issued the request against its scheduled arrival."""
    error: str = ""
    """The error's message, when the request failed."""

    @property
    def ok(self) -> bool:
        """Completed without an error."""
        return not self.route.startswith("error:")

    def meets_ttft(self, slo: Slo) -> bool:
        """Completed and TTFT within its class's objective."""
        return self.ok and self.ttft_ms <= slo.ttft_ms[self.cls]

    def meets_tpot(self, slo: Slo) -> bool:
        """Completed and TPOT within its class's objective."""
        return self.ok and self.tpot_ms <= slo.tpot_ms[self.cls]


@dataclass(slots=True)
class PointResult:
    """Attainment of one rate point (fractions in [0, 1])."""

    rate_rps: float
    n: int
    ttft_attainment: float
    tpot_attainment: float
    joint_attainment: float
    p50_ttft_ms: float
    p90_ttft_ms: float
    p50_tpot_ms: float
    p90_tpot_ms: float
    errors: int
    routes: dict[str, int] = field(default_factory=dict)
    max_start_lag_ms: float = 0.0
    wall_s: float = 0.0
    first_error: str = ""
    """Message of the first failed request (diagnosis), truncated."""
    joint_interval: tuple[float, float] = (0.0, 1.0)
    """95% Wilson score interval of the joint attainment: with a dozen requests a
    point, one request is 8% of it, and two modes' points within each other's
    intervals are not told apart by this run."""

    def passed(self, target: float) -> bool:
        """Joint attainment reaches `target`."""
        return self.joint_attainment >= target


def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion hits / n (z = 1.96: 95%)."""
    if n <= 0:
        return 0.0, 1.0
    p, z2 = hits / n, z * z
    mid = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return round(max(0.0, mid - half), 4), round(min(1.0, mid + half), 4)


def score(rate_rps: float, outcomes: list[Outcome], slo: Slo, wall_s: float) -> PointResult:
    """Attainment of each SLO and of both, plus latency quantiles of completed requests."""
    n = len(outcomes)
    done = [o for o in outcomes if o.ok]
    ttft = [o.meets_ttft(slo) for o in outcomes]
    tpot = [o.meets_tpot(slo) for o in outcomes]
    return PointResult(
        rate_rps=rate_rps, n=n,
        ttft_attainment=sum(ttft) / n, tpot_attainment=sum(tpot) / n,
        joint_attainment=sum(a and b for a, b in zip(ttft, tpot)) / n,
        p50_ttft_ms=_quantile([o.ttft_ms for o in done], 0.5),
        p90_ttft_ms=_quantile([o.ttft_ms for o in done], 0.9),
        p50_tpot_ms=_quantile([o.tpot_ms for o in done], 0.5),
        p90_tpot_ms=_quantile([o.tpot_ms for o in done], 0.9),
        errors=n - len(done), routes=dict(Counter(o.route for o in outcomes)),
        max_start_lag_ms=max(o.start_lag_ms for o in outcomes), wall_s=wall_s,
        first_error=next((o.error[:300] for o in outcomes if not o.ok), ""),
        joint_interval=wilson(sum(a and b for a, b in zip(ttft, tpot)), n))


async def _one(client: AsyncClient, r: Request, slo: Slo, lag_ms: float) -> Outcome:
    try:
        res = await client.generate_full(
            prompt_ids=r.prompt_ids, max_tokens=r.max_tokens, seed=r.seed, ignore_eos=True,
            slo_ttft_ms=slo.ttft_ms[r.cls], slo_tpot_ms=slo.tpot_ms[r.cls],
            deadline_s=REQUEST_DEADLINE_S)
    except PdError as e:
        return Outcome(r.cls, float("inf"), float("inf"), 0, f"error:{e.code}", lag_ms, e.message)
    tpot = client_tpot_ms(res.latency_ms, res.ttft_ms, res.num_tokens)
    return Outcome(r.cls, res.ttft_ms, tpot, res.num_tokens, res.route, lag_ms)


class Router(NamedTuple):
    """A cluster's router: its address and the client certificate it takes (None: insecure)."""

    address: str
    tls_files: TlsFiles | None


def _client(router: Router) -> AsyncClient:
    return AsyncClient(router.address, timeout_s=30.0, tls_files=router.tls_files)


async def run_point(router: Router, requests: list[Request], rate_rps: float, slo: Slo,
                    max_wall_s: float = float("inf"),
                    on_done: Callable[[int], None] = lambda done: None) -> list[Outcome]:
    """Issue each request at arrival_unit_s / rate (open loop) and wait for all of them.

    Requests still running `max_wall_s` after the first was issued are
    cancelled (the router frees their work) and count as misses with
    route 'error:POINT_WALL_CAP': a wedged or hopelessly overloaded point
    cannot eat the run's time budget.
    """
    loop = asyncio.get_running_loop()
    finished = 0

    def count(_task: asyncio.Task) -> None:
        nonlocal finished
        finished += 1
        on_done(finished)

    async with _client(router) as client:
        t0 = loop.time()
        tasks = []
        for r in requests:
            due = t0 + r.arrival_unit_s / rate_rps
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            task = asyncio.create_task(_one(client, r, slo, 1000 * (loop.time() - due)))
            task.add_done_callback(count)
            tasks.append(task)
        _, late = await asyncio.wait(tasks, timeout=max(0.0, t0 + max_wall_s - loop.time()))
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    return [Outcome(r.cls, float("inf"), float("inf"), 0, "error:POINT_WALL_CAP", 0.0,
                    f"still running {max_wall_s:.0f} s into the point; cancelled")
            if t.cancelled() else t.result() for r, t in zip(requests, tasks)]


async def warm_up(router: Router, vocab_size: int, seed: int, concurrent: int) -> None:
    """First calls on a fresh worker pay one-off costs; give every worker one (not measured)."""
    rng = random.Random(f"warm/{seed}")
    async with _client(router) as client:
        await asyncio.gather(*(client.generate_full(
            prompt_ids=random_prompt(rng, 300, vocab_size), max_tokens=4, ignore_eos=True,
            deadline_s=REQUEST_DEADLINE_S) for _ in range(concurrent)))


@dataclass(frozen=True, slots=True)
class Isolated:
    """Single-request (unloaded) latencies of one class at its median lengths."""

    ttft_ms: float
    tpot_ms: float
    prompt_tokens: int
    output_tokens: int
    repeats: int


async def measure_isolated(router: Router, c: RequestClass, vocab_size: int, repeats: int,
                           seed: int) -> Isolated:
    """Median TTFT and TPOT of `repeats` sequential requests of c's median lengths, fresh prompts each."""
    rng = random.Random(f"calibrate/{c.name}/{seed}")
    ttft, tpot = [], []
    async with _client(router) as client:
        for _ in range(repeats):
            res = await client.generate_full(
                prompt_ids=random_prompt(rng, c.median_prompt_tokens, vocab_size),
                max_tokens=c.median_output_tokens, ignore_eos=True, deadline_s=REQUEST_DEADLINE_S)
            ttft.append(res.ttft_ms)
            tpot.append(client_tpot_ms(res.latency_ms, res.ttft_ms, res.num_tokens))
    return Isolated(statistics.median(ttft), statistics.median(tpot),
                    c.median_prompt_tokens, c.median_output_tokens, repeats)
