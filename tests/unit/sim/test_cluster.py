"""Whole simulated clusters: every request served once, every block given back, routes as
the mode says, and the router's own decision code deciding (a change to it shows)."""

from __future__ import annotations

import math
import statistics

import pytest

from router.pricing import decision
from sim.cluster import ClusterSpec, Simulation
from sim.workload import Workload, interleave
from tests.unit.sim.conftest import make_profile


def workload(rate=20.0, n=300, seed=1, prompt=800, output=64) -> Workload:
    return Workload.synthetic(rate, n, prompt_median=prompt, output_median=output, sigma=0.8, seed=seed)


def check_clean(sim: Simulation) -> None:
    for w in sim.workers:
        assert w.free_blocks == w.engine.total_blocks, f"{w.worker_id} leaked {w.engine.total_blocks - w.free_blocks}"
        assert not w.prefill_q and not w.batch and not w.joining and w.pending_tokens == 0
    assert len(sim.router.inflight) == 0, "a stream booking outlived its request"


@pytest.mark.parametrize("mode,spec", [("colocated", ClusterSpec(mixed=3)),
                                       ("disaggregated", ClusterSpec(prefill=1, decode=2)),
                                       ("auto", ClusterSpec(prefill=1, decode=1, mixed=1))])
def test_every_request_served_and_every_block_back(mode, spec):
    w = workload()
    sim = Simulation(spec, make_profile(), mode, slo_ttft_ms=0, slo_tpot_ms=0)
    res = sim.run(w)
    assert len(res.requests) == len(w)
    assert all(r.served for r in res.requests), res.routes
    if mode != "auto":
        assert set(res.routes) == {mode}
    for r, req in zip(res.requests, w.requests):
        assert r.prompt_tokens == req.prompt_tokens and r.ttft_ms > 0
        assert (r.tpot_ms > 0) == (req.output_tokens > 1)
        assert math.isfinite(r.predicted_ttft_ms)
    check_clean(sim)


def test_pool_pressure_queues_and_still_leaks_nothing():
    # 64 blocks of 16 tokens per worker: a few requests fit at once, the rest wait for room.
    w = workload(rate=200.0, n=120, prompt=200, output=100)
    sim = Simulation(ClusterSpec(prefill=1, decode=1), make_profile(total_blocks=64), "disaggregated")
    res = sim.run(w)
    served = [r for r in res.requests if r.served]
    assert len(served) + res.routes.get("unserved", 0) == len(w)
    assert max(r.queue_ms for r in served) > 0, "nothing waited for K/V room at 200 rps on 64 blocks"
    assert all(r.prompt_tokens + r.output_tokens - 1 > 64 * 16 for r in res.requests if not r.served)
    check_clean(sim)


def test_auto_rejects_what_no_route_can_meet():
    w = workload(rate=5.0, n=60)
    sim = Simulation(ClusterSpec(prefill=1, decode=1), make_profile(), "auto", slo_ttft_ms=1.0, slo_tpot_ms=0.5,
                     reject_unconfirmed=True)
    res = sim.run(w)
    assert res.routes.get("rejected", 0) > 0
    assert res.attainment()["both"] < 0.5
    check_clean(sim)


def test_the_routers_decision_code_decides(monkeypatch):
    """Auto mode's route split comes from router/pricing/decision.py: forcing its choice
    changes the simulated routes."""
    w = workload(rate=10.0, n=150)
    spec = ClusterSpec(prefill=1, decode=1, mixed=1)
    base = Simulation(spec, make_profile(), "auto").run(w).routes
    real_pick = decision.pick
    monkeypatch.setattr(decision, "pick", lambda best_dis, best_col, params, note="", dis_ok=True, col_ok=True:
                        real_pick(None, best_col, params, note, dis_ok, col_ok))
    forced = Simulation(spec, make_profile(), "auto").run(w).routes
    assert forced.get("disaggregated", 0) == 0 and forced.get("colocated") == len(w)
    assert base.get("disaggregated", 0) > 0, base


def test_interference_shows_in_colocated_tpot():
    """Long prompts colocated stall the streams beside them; split, they do not."""
    w = interleave([workload(rate=4.0, n=80, prompt=64, output=200, seed=2),
                    workload(rate=4.0, n=80, prompt=6000, output=2, seed=3)])
    prof = make_profile(chunk=8192)
    col = Simulation(ClusterSpec(mixed=2), prof, "colocated").run(w).quantiles("tpot_ms")["p90"]
    dis = Simulation(ClusterSpec(prefill=1, decode=1), prof, "disaggregated").run(w).quantiles("tpot_ms")["p90"]
    assert col > 1.5 * dis, (col, dis)


def test_deterministic():
    w = workload(n=100)
    a = Simulation(ClusterSpec(prefill=1, decode=2), make_profile(), "auto", 500, 50).run(w)
    b = Simulation(ClusterSpec(prefill=1, decode=2), make_profile(), "auto", 500, 50).run(w)
    assert [(r.route, r.ttft_ms, r.tpot_ms) for r in a.requests] == \
        [(r.route, r.ttft_ms, r.tpot_ms) for r in b.requests]


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="decode-capable"):
        ClusterSpec(prefill=2)
    with pytest.raises(ValueError, match="needs a prefill-capable"):
        Simulation(ClusterSpec(decode=2), make_profile(), "disaggregated")
    with pytest.raises(ValueError, match="mode must be"):
        Simulation(ClusterSpec(decode=2), make_profile(), "sideways")


def test_a_shared_host_stretches_the_steps():
    """Two workers on one core, and the serving path's CPU beside them: every step of a busy
    cluster takes longer than on dedicated cores; with cores to spare nothing changes."""
    import dataclasses

    from sim.profile import HostProfile

    w = workload(rate=30.0, n=150)
    own = Simulation(ClusterSpec(decode=2), make_profile(), "colocated").run(w)
    spare = dataclasses.replace(make_profile(), host=HostProfile(cores=64.0))
    assert [r.ttft_ms for r in Simulation(ClusterSpec(decode=2), spare, "colocated").run(w).requests] == \
        [r.ttft_ms for r in own.requests]
    shared = dataclasses.replace(make_profile(), host=HostProfile(cores=1.0, token_cpu_ms=0.2, request_cpu_ms=2.0))
    sim = Simulation(ClusterSpec(decode=2), shared, "colocated")
    slow = sim.run(w)
    assert slow.quantiles("tpot_ms")["p50"] > 1.5 * own.quantiles("tpot_ms")["p50"]
    assert slow.quantiles("ttft_ms")["p50"] > own.quantiles("ttft_ms")["p50"]
    check_clean(sim)


def test_a_hand_offs_admission_stalls_the_decode_batch():
    import dataclasses

    w = workload(rate=20.0, n=100, output=40)
    base = make_profile()
    slow = dataclasses.replace(base, overheads=dataclasses.replace(base.overheads, admit_ms=20.0))
    a = Simulation(ClusterSpec(prefill=1, decode=1), base, "disaggregated").run(w)
    sim = Simulation(ClusterSpec(prefill=1, decode=1), slow, "disaggregated")
    b = sim.run(w)
    # about one admission per stream's lifetime per request in flight: tens of ms over ~40 gaps
    assert b.quantiles("tpot_ms")["p50"] > a.quantiles("tpot_ms")["p50"] + 0.3
    check_clean(sim)


def test_on_a_shared_host_a_busy_decode_worker_delays_the_hand_off():
    """sim/cluster.py `_queued`: the hand-off's control plane at D waits behind D's engine loop
    on a shared host (/ (1 - D's recent busy share)): the first token gap grows with the load,
    by more than the steps alone make it grow without the rule (cores to spare: no stretch)."""
    import dataclasses

    from sim.profile import HostProfile

    base = make_profile()
    slow_handoff = dataclasses.replace(base, overheads=dataclasses.replace(base.overheads, handoff_ms=8.0))
    shared = dataclasses.replace(slow_handoff, host=HostProfile(cores=64.0))

    def first_gap(profile, rate):
        sim = Simulation(ClusterSpec(prefill=1, decode=1), profile, "disaggregated")
        res = sim.run(workload(rate=rate, n=120, output=40))
        check_clean(sim)
        return statistics.median(r.first_gap_ms for r in res.requests if r.served)

    own_light, own_busy = first_gap(slow_handoff, 1.0), first_gap(slow_handoff, 25.0)
    shared_light, shared_busy = first_gap(shared, 1.0), first_gap(shared, 25.0)
    assert shared_light == pytest.approx(own_light, rel=0.15)  # an idle D: the same hand-off
    assert shared_busy - own_busy > 4.0  # a busy D: the hand-off waits behind its loop
