"""The canary's record (docs/design.md, The release): what this router served since the release entered
CANARY, judged when a promotion to ACTIVE is asked.

`CanaryTally` listens to the router's metrics (runtime/telemetry/catalog.py) and keeps a
bounded, timestamped trace of disaggregated attempts and completed requests by route;
`canary_record` cuts it at the record's last transition into CANARY and checks:

    canary_samples                  disaggregated requests completed >= canary_min_samples
    ttft_attainment / tpot_attainment
                                    the share of disaggregated requests meeting their TTFT
                                    (TPOT) target >= colocated requests' in the same window,
                                    each route judged on >= canary_min_samples requests with
                                    a target of that clock (none set: not measurable, fails)
    stale_publications              hand-offs whose decode published K/V other than its
                                    prefill computed (caught by the router's digest check) == 0
    unauthorized_accepted_transfers hand-offs dispatched without a router-signed capability
                                    == 0 (the workers refuse any other: the failure smoke)
    transfer_failure_rate           failed disaggregated attempts / dispatched
                                    <= canary_max_transfer_failure_rate

Each router judges what it served itself (the one asked to promote); the release's own
probes (tenant pdserve-release) are not samples.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

from router.release.gates import Check
from router.release.probes import TENANT as PROBE_TENANT
from runtime.release.machine import Release

CAPACITY = 65536
"""Events kept (the oldest go first): the canary is judged on at most the newest ones."""


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclasses.dataclass(slots=True)
class Attainment:
    """Requests of one route with a target of one clock, and how many met it."""

    judged: int = 0
    met: int = 0

    def add(self, target_s: float, value_s: float) -> None:
        if target_s > 0:
            self.judged += 1
            self.met += value_s <= target_s

    @property
    def share(self) -> float:
        return self.met / self.judged if self.judged else 0.0


@dataclasses.dataclass(slots=True)
class Window:
    """The tally cut at one time."""

    completed: dict[str, int] = dataclasses.field(default_factory=dict)
    ttft: dict[str, Attainment] = dataclasses.field(default_factory=dict)
    tpot: dict[str, Attainment] = dataclasses.field(default_factory=dict)
    attempts: int = 0
    failures: int = 0
    other_kv: int = 0


class CanaryTally:
    """Listens to RouterMetrics (`listeners`): a bounded trace of attempts and completions."""

    def __init__(self, clock=_now_ms, capacity: int = CAPACITY):
        self._clock = clock
        self._attempts: deque[tuple[int, str, bool]] = deque(maxlen=capacity)
        """(ms, failed status code or '' for a dispatch, published other K/V)."""
        self._completed: deque[tuple[int, str, float, float, float, float, int]] = deque(maxlen=capacity)
        """(ms, route, ttft_s, slo_ttft_s, tpot_s, slo_tpot_s, tokens)."""

    def dispatched(self, number: int, route: str, planned: str, previous_stage: str | None) -> None:
        if route == "disaggregated":
            self._attempts.append((self._clock(), "", False))

    def attempt_failed(self, route: str, code: str, published_other_kv: bool) -> None:
        if route == "disaggregated":
            self._attempts.append((self._clock(), code, published_other_kv))

    def completed(self, tenant: str, prompt_tokens: int, ttft_s: float, tpot_s: float, num_tokens: int,
                  slo_ttft_s: float, slo_tpot_s: float, route: str) -> None:
        if tenant != PROBE_TENANT and route:
            self._completed.append((self._clock(), route, ttft_s, slo_ttft_s, tpot_s, slo_tpot_s, num_tokens))

    def since(self, t_ms: int) -> Window:
        w = Window()
        for at, code, other in self._attempts:
            if at >= t_ms:
                w.attempts += not code
                w.failures += bool(code)
                w.other_kv += other
        for at, route, ttft, slo_ttft, tpot, slo_tpot, tokens in self._completed:
            if at >= t_ms:
                w.completed[route] = w.completed.get(route, 0) + 1
                w.ttft.setdefault(route, Attainment()).add(slo_ttft, ttft)
                if tokens > 1:
                    w.tpot.setdefault(route, Attainment()).add(slo_tpot, tpot)
        return w


def canary_started_ms(record) -> int:
    """When the record last entered CANARY (0: never)."""
    return max((t.at_ms for t in record.history if t.to_state is Release.CANARY), default=0)


def canary_record(ctl, tally: CanaryTally) -> list[Check]:
    """The canary's gates (see the module docstring), from `tally` cut at the canary's start."""
    cfg, start = ctl.config, canary_started_ms(ctl.record)
    if not start:
        return [Check("canary_record", False, "the release never entered CANARY: there is no canary to judge")]
    w = tally.since(start)
    need = cfg.canary_min_samples
    dis = w.completed.get("disaggregated", 0)
    checks = [Check("canary_samples", dis >= need,
                    f"{dis} disaggregated and {w.completed.get('colocated', 0)} colocated requests completed "
                    f"here since CANARY", dis, need)]
    for clock, by_route in (("ttft", w.ttft), ("tpot", w.tpot)):
        d, c = by_route.get("disaggregated", Attainment()), by_route.get("colocated", Attainment())
        name = f"{clock}_attainment"
        if min(d.judged, c.judged) < need:
            checks.append(Check(name, False, f"not measurable: {d.judged} disaggregated and {c.judged} colocated "
                                             f"requests with a {clock.upper()} target (each needs {need})"))
            continue
        checks.append(Check(name, d.share >= c.share,
                            f"disaggregated {d.met}/{d.judged} met their {clock.upper()} target against "
                            f"colocated {c.met}/{c.judged}", round(d.share, 4), round(c.share, 4)))
    checks.append(Check("stale_publications", w.other_kv == 0,
                        f"{w.other_kv} hand-offs published K/V other than their prefill computed", w.other_kv, 0))
    unsigned = w.attempts if ctl.orch.mint is None else 0
    checks.append(Check("unauthorized_accepted_transfers", unsigned == 0,
                        f"{unsigned} of {w.attempts} hand-offs ran without a router-signed capability", unsigned, 0))
    rate = w.failures / w.attempts if w.attempts else 0.0
    limit = cfg.canary_max_transfer_failure_rate
    checks.append(Check("transfer_failure_rate", rate <= limit,
                        f"{w.failures} of {w.attempts} disaggregated attempts failed", round(rate, 4), limit))
    return checks
