"""The promotion drill against the in-memory fake: one state at a time to ACTIVE through
the gates; a refusal fails the drill with the router's verdicts, a gate that could not
be measured included; with its defaults it gives the router's canary gates what they
judge on (the samples the router asks, targets where it sets none)."""

from __future__ import annotations

import pytest

from pdserve_ops.drill.cluster import DrillError
from pdserve_ops.drill.fake import CANARY_GATES, FakeCluster, FakeKnobs
from pdserve_ops.drill.report import render
from pdserve_ops.drill.run import FALLBACK_SLO_MS, DrillOptions, failed_gates, promote_drill, rollback_drill

FAST = {"rate_rps": 200, "duration_s": 0.3, "trigger_after_s": 0.05, "max_tokens": 4, "settle_s": 0,
        "step_dwell_s": 0}
QUICK = DrillOptions(**FAST, canary_samples=3)


def rolled_back(canary_min_samples: int = 3, router_slo_ms=(0.0, 0.0), **knobs) -> FakeCluster:
    """A fake after a passed rollback drill, with `knobs` on from then; its router's canary
    judges on `canary_min_samples` and gives `router_slo_ms` to requests that name none."""
    cluster = FakeCluster(canary_min_samples=canary_min_samples, router_slo_ms=router_slo_ms)
    assert rollback_drill(cluster, QUICK).passed
    cluster.state.knobs = FakeKnobs(**knobs)
    return cluster


def test_promotion_from_a_completed_rollback_to_active():
    cluster = rolled_back()
    r = promote_drill(cluster, QUICK)
    assert r.passed, render(r)
    assert [(p.from_mode, p.to_mode, p.passed) for p in r.promotions] == [
        ("rolled_back", "pinned", True), ("pinned", "shadow", True), ("shadow", "canary", True),
        ("canary", "active", True)]
    assert [g.name for g in r.promotions[-1].gates][-len(CANARY_GATES):] == list(CANARY_GATES)
    # The drill stayed in CANARY until the load had served enough on each route.
    assert r.routes["disaggregated"] >= 3 and r.routes["colocated"] >= 3, r.routes
    assert (r.release_before, r.release_after) == ("rolled_back", "active")
    assert cluster.recorded[-1].mode == "active" and cluster.state.canary_fraction == QUICK.canary_fraction
    assert "PASS  promoted_to_active" in render(r) and "ROLLED_BACK -> PINNED -> SHADOW" in render(r)


def test_a_failed_gate_refuses_the_promotion_and_the_drill_says_so():
    cluster = rolled_back(failing_gates={"failure_injection_smoke": "bad_capability FAILED: prefill ran it"})
    r = promote_drill(cluster, QUICK)
    assert not r.passed
    assert [(p.to_mode, p.passed) for p in r.promotions] == [("pinned", True), ("shadow", False)]
    refused = r.promotions[-1]
    assert [(g.name, g.passed) for g in refused.gates] == [("failure_injection_smoke", False)]
    assert refused.refusal.startswith("FAILED_PRECONDITION: promotion to SHADOW refused: 1 of 4 gates failed")
    check = r.check("promoted_to_active")
    assert not check.passed and check.value == 1
    assert "failure_injection_smoke: bad_capability FAILED: prefill ran it" in check.detail
    assert "could not be measured" not in check.detail
    assert r.release_after == "pinned" and cluster.recorded[-1].mode == "pinned"
    assert [c.name for c in r.checks if not c.passed] == ["promoted_to_active"]
    assert "promotion PINNED -> SHADOW: REFUSED" in render(r)


def test_a_canary_gate_that_could_not_be_measured_is_named_so():
    cluster = rolled_back(failing_gates={"ttft_attainment": "not measurable: 0 disaggregated and 0 colocated "
                                                            "requests with a TTFT target (each needs 20)"})
    r = promote_drill(cluster, QUICK)
    assert [(p.to_mode, p.passed) for p in r.promotions][-1] == ("active", False)
    check = r.check("promoted_to_active")
    assert "CANARY -> ACTIVE refused: ttft_attainment: not measurable" in check.detail
    assert check.detail.endswith("(gates that could not be measured: ttft_attainment)")
    assert r.release_after == "canary"


def test_a_failed_request_fails_the_promotion_drill():
    r = promote_drill(rolled_back(fail_requests=10**6), QUICK)
    assert not r.check("requests_failed").passed and r.succeeded == 0
    assert not r.check("tokens_equal_colocated").passed and r.check("tokens_equal_colocated").value is None


def test_nothing_to_promote_is_refused():
    with pytest.raises(DrillError, match="ACTIVE already"):
        promote_drill(FakeCluster(), QUICK)


def test_failed_gates_reads_the_routers_refusal():
    message = ("promotion to ACTIVE refused: 3 of 5 gates failed: exactness_smoke FAILED (1 vs 0): prompt 1: "
               "first differs at token 3; failure_injection_smoke FAILED: not measured by this build: mid-transfer "
               "kill; stale completion; canary_record FAILED: not measured by this build: canary samples")
    gates = failed_gates(message)
    assert [(g.name, g.passed) for g in gates] == [("exactness_smoke", False), ("failure_injection_smoke", False),
                                                   ("canary_record", False)]
    assert gates[0].detail == "prompt 1: first differs at token 3"
    assert gates[1].detail == "not measured by this build: mid-transfer kill; stale completion"
    assert failed_gates("ACTIVE -> PINNED is not a legal release transition") == []


def test_the_defaults_give_the_routers_canary_what_it_judges_on():
    """The router needs 20 samples per route and sets no target: the load carries the
    drill's fallback targets and the drill waits for 20 on each route."""
    cluster = rolled_back(canary_min_samples=20)
    r = promote_drill(cluster, DrillOptions(**FAST))
    assert r.passed, render(r)
    assert (r.options["canary_samples"], r.options["slo_ttft_ms"], r.options["slo_tpot_ms"]) == (
        20, FALLBACK_SLO_MS["slo_ttft_ms"], FALLBACK_SLO_MS["slo_tpot_ms"])
    assert "canary: waits for 20 requests on each route; load targets TTFT 10000 ms, TPOT 1000 ms" in render(r)


def test_a_router_with_targets_judges_the_load_on_its_own():
    cluster = rolled_back(canary_min_samples=8, router_slo_ms=(500.0, 50.0))
    r = promote_drill(cluster, DrillOptions(**FAST))
    assert r.passed, render(r)
    assert (r.options["canary_samples"], r.options["slo_ttft_ms"], r.options["slo_tpot_ms"]) == (8, 0.0, 0.0)
    assert "load targets TTFT the router's, TPOT the router's" in render(r)


def test_fewer_canary_samples_than_the_router_judges_on_fail_the_drill_naming_the_gate():
    r = promote_drill(rolled_back(canary_min_samples=40), DrillOptions(**FAST, canary_samples=3))
    assert not r.passed and r.release_after == "canary"
    assert "canary_samples:" in r.check("promoted_to_active").detail
