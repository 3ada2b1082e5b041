"""The canary's record (router/release/canary.py): what the router served, cut at the
record's last entry into CANARY, against each gate's threshold; and its wiring into the
router's metrics over the in-process fake cluster."""

from __future__ import annotations

import types

import pytest

from router.release.canary import CanaryTally, canary_record
from router.release.controller import ReleaseController
from router.requests.orchestrator import Orchestrator
from router.types import Mode
from runtime.release.machine import Release
from runtime.release.record import ReleaseRecord, Transition
from tests.support.orchestrator import collect, config, params, run, two_by_two

START = 1_000


def record(canary_at: int | None = START) -> ReleaseRecord:
    history = (Transition(Release.PINNED, Release.SHADOW, 10, "op", "r"),)
    if canary_at is not None:
        history += (Transition(Release.SHADOW, Release.CANARY, canary_at, "op", "r"),)
    return ReleaseRecord(Release.CANARY if canary_at is not None else Release.SHADOW, 3, history=history)


def ctl(rec: ReleaseRecord, signed: bool = True, **cfg):
    cfg.setdefault("canary_min_samples", 3)
    return types.SimpleNamespace(config=config(**cfg), record=rec,
                                 orch=types.SimpleNamespace(mint=(lambda m, r: b"cap") if signed else None))


class Clock:
    def __init__(self, t: int = START):
        self.t = t

    def __call__(self) -> int:
        return self.t


def served(tally: CanaryTally, route: str, n: int, ttft_s: float = 0.1, tpot_s: float = 0.01,
           slo=(0.5, 0.05), tenant: str = "t", tokens: int = 8) -> None:
    for _ in range(n):
        if route == "disaggregated":
            tally.dispatched(1, route, route, None)
        tally.completed(tenant, 16, ttft_s, tpot_s, tokens, slo[0], slo[1], route)


def verdicts(checks) -> dict[str, tuple[bool, float, float]]:
    return {c.name: (c.passed, c.measured, c.threshold) for c in checks}


def test_a_healthy_canary_passes_every_gate_with_its_figures():
    tally = CanaryTally(Clock())
    served(tally, "disaggregated", 4)
    served(tally, "colocated", 3, ttft_s=0.6)  # colocated misses its TTFT target
    v = verdicts(canary_record(ctl(record()), tally))
    assert v == {"canary_samples": (True, 4, 3), "ttft_attainment": (True, 1.0, 0.0),
                 "tpot_attainment": (True, 1.0, 1.0), "stale_publications": (True, 0, 0),
                 "unauthorized_accepted_transfers": (True, 0, 0), "transfer_failure_rate": (True, 0.0, 0.05)}


def test_only_what_was_served_since_the_canary_began_counts():
    clock = Clock(START - 1)
    tally = CanaryTally(clock)
    served(tally, "disaggregated", 10)
    served(tally, "colocated", 10)
    clock.t = START
    served(tally, "disaggregated", 2)
    served(tally, "colocated", 5)
    served(tally, "disaggregated", 5, tenant="pdserve-release")  # the release's own probes are no samples
    checks = {c.name: c for c in canary_record(ctl(record()), tally)}
    assert not checks["canary_samples"].passed and checks["canary_samples"].measured == 2
    assert "2 disaggregated and 5 colocated" in checks["canary_samples"].detail
    assert not checks["ttft_attainment"].passed and "not measurable" in checks["ttft_attainment"].detail


def test_disaggregated_attainment_below_colocated_fails_and_says_by_how_much():
    tally = CanaryTally(Clock())
    served(tally, "disaggregated", 3)
    served(tally, "disaggregated", 1, tpot_s=0.2)  # misses its TPOT target
    served(tally, "colocated", 4)
    checks = {c.name: c for c in canary_record(ctl(record()), tally)}
    assert checks["ttft_attainment"].passed
    tpot = checks["tpot_attainment"]
    assert not tpot.passed and (tpot.measured, tpot.threshold) == (0.75, 1.0)
    assert "disaggregated 3/4 met their TPOT target against colocated 4/4" in tpot.detail


def test_without_slo_targets_attainment_is_not_measurable_and_fails():
    tally = CanaryTally(Clock())
    served(tally, "disaggregated", 5, slo=(0.0, 0.0))
    served(tally, "colocated", 5, slo=(0.0, 0.0))
    checks = {c.name: c for c in canary_record(ctl(record()), tally)}
    assert checks["canary_samples"].passed
    for name in ("ttft_attainment", "tpot_attainment"):
        assert not checks[name].passed and "0 disaggregated and 0 colocated requests with a" in checks[name].detail


@pytest.mark.parametrize("fault,gate", [("other_kv", "stale_publications"),
                                        ("unsigned", "unauthorized_accepted_transfers"),
                                        ("failures", "transfer_failure_rate")])
def test_each_hand_off_fault_fails_its_gate(fault, gate):
    tally = CanaryTally(Clock())
    served(tally, "disaggregated", 30)
    served(tally, "colocated", 10)
    if fault == "other_kv":  # one failed attempt of 30: within the failure bound
        tally.dispatched(1, "disaggregated", "disaggregated", None)
        tally.attempt_failed("disaggregated", "ABORTED", True)
    if fault == "failures":
        for _ in range(2):
            tally.dispatched(1, "disaggregated", "disaggregated", None)
            tally.attempt_failed("disaggregated", "UNAVAILABLE", False)
    tally.attempt_failed("colocated", "UNAVAILABLE", False)  # a colocated failure is no transfer failure
    checks = canary_record(ctl(record(), signed=fault != "unsigned"), tally)
    assert [c.name for c in checks if not c.passed] == [gate]


def test_a_release_that_never_entered_canary_has_no_canary_to_judge():
    checks = canary_record(ctl(record(canary_at=None)), CanaryTally(Clock()))
    assert [(c.name, c.passed) for c in checks] == [("canary_record", False)]


def test_the_router_feeds_the_tally_by_route_through_its_metrics():
    fake = two_by_two()

    async def go():
        orch = Orchestrator(fake, fake, config(slo_ttft_ms=60_000, slo_tpot_ms=60_000))
        controller = ReleaseController(orch, "router-a", orch.config, "tok")
        for i, mode in enumerate([Mode.DISAGGREGATED, Mode.COLOCATED, Mode.DISAGGREGATED]):
            _, error = await collect(orch, params(f"r{i}", mode=mode))
            assert error is None
        return controller.canary.since(0)

    w = run(go())
    assert w.completed == {"disaggregated": 2, "colocated": 1}
    assert (w.ttft["disaggregated"].judged, w.ttft["disaggregated"].met) == (2, 2)
    assert (w.attempts, w.failures, w.other_kv) == (2, 0, 0)
