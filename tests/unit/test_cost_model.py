"""Router cost model: profile evaluation, defaults, EWMA corrections and their bounds; scorer scales; config parsing."""

from __future__ import annotations

import pytest

from kv_directory.profile import CostProfile
from router.candidate import Candidate, ScoreContext
from router.config import RouterConfig
from router.cost_model import CLAMP, CostModel
from router.scorers import SCORERS, build
from router.types import Capacity, Load, Role, Route, Worker

PROFILE = CostProfile(prefill_base_ms=2.0, prefill_ms_per_token=0.5, prefill_ms_per_pair=0.001,
                      decode_base_ms=4.0, decode_ms_per_seq=1.0, decode_ms_per_context_token=0.01,
                      kv_bytes_per_block=1000, source="test")


def w(profile=PROFILE, **load) -> Worker:
    return Worker("w", Role.DECODE, "w:1", profile=profile, load=Load(**load),
                  capacity=Capacity(total_blocks=100, max_decode_batch=4, max_prefill_tokens=128, block_size=16))


def test_profile_evaluation_by_hand():
    c = CostModel(RouterConfig()).costs(w(pending_prefill_tokens=100, active_decode_batch=2, active_context_tokens=300))
    assert c.prefill_ms(100, 50) == pytest.approx(2 + 50 + 0.001 * 100 * 100)
    assert c.queue_ms == pytest.approx(2 + 0.5 * 100)
    assert c.step_ms == pytest.approx(4 + 2 + 3)
    assert c.admission_ms == pytest.approx(c.step_ms + 2 + 0.5 * 100)
    # batch 3 (of max 4): one round; context 300 + 40 + 10 // 2.
    assert c.tpot_with(40, 10) == pytest.approx(4 + 3 + 0.01 * 345 + c.queue_ms / 9)


def test_default_profile_for_silent_workers():
    c = CostModel(RouterConfig(default_prefill_ms_per_token=0.3, default_decode_step_ms=7.0)).costs(w(CostProfile()))
    assert c.prefill_ms(10, 0) == pytest.approx(3.0) and c.decode_step_ms(1, 0) == pytest.approx(7.0)


def test_corrections_follow_observations_and_stay_bounded():
    model = CostModel(RouterConfig(cost_ewma_alpha=0.5))
    worker = w()
    before = model.costs(worker).prefill_ms(100, 0)
    model.observe_prefill(worker, 100, 0, before * 2)
    assert model.costs(worker).prefill_ms(100, 0) == pytest.approx(before * 2)  # first sample sets it
    model.observe_prefill(worker, 100, 0, before * 1e9)
    assert model.corrections()["prefill/w"] <= CLAMP
    model.observe_transfer(worker, w(), 10**6, 0.0)  # nonsense sample ignored
    assert model.transfer_ms("w", "w", 10**6) == pytest.approx(1.0 + 1.0)
    model.observe_transfer(worker, worker, 10**6, 4.0)
    assert model.transfer_ms("w", "w", 10**6) == pytest.approx(4.0)
    model.observe_ttft(Route.COLOCATED, predicted_ms=10.0, observed_ms=0.0)
    assert model.overhead_ms(Route.COLOCATED) == 1.0


def candidate(**kw) -> Candidate:
    base = dict(route=Route.COLOCATED, decode=w(), prefill=None, ttft_ms=100.0, tpot_ms=10.0, queue_ms=0.0,
                prefill_ms=0.0, transfer_ms=0.0, admission_ms=0.0, overhead_ms=0.0, prompt_tokens=100,
                compute_tokens=100, transfer_tokens=0, transfer_bytes=0, queue_tokens=0, free_blocks_after=50,
                total_blocks=100)
    return Candidate(**{**base, **kw})


@pytest.mark.parametrize("kw", [{}, dict(ttft_ms=1e9, tpot_ms=1e9, queue_tokens=10**9, free_blocks_after=-5,
                                         compute_tokens=1), dict(total_blocks=0, prompt_tokens=0)])
def test_every_scorer_stays_in_unit_interval(kw):
    for name, cls in SCORERS.items():
        for ctx in (ScoreContext(0, 0, 50.0, 5.0), ScoreContext(200, 20, 50.0, 5.0)):
            assert 0.0 <= cls().score(candidate(**kw), ctx) <= 1.0, name


def test_scorer_scales_by_hand():
    ctx = ScoreContext(slo_ttft_ms=200, slo_tpot_ms=0, best_ttft_ms=50, best_tpot_ms=5)
    s = {n: cls().score(candidate(queue_tokens=1024, compute_tokens=25), ctx) for n, cls in SCORERS.items()}
    assert s == pytest.approx({"ttft_slack": 0.5, "tpot_slack": 0.0, "queue": 0.5, "kv_headroom": 0.5,
                               "prefix_hit": 0.75})


def test_config_parses_weights_and_tenant_slos_with_clear_errors():
    cfg = RouterConfig.from_env({"PD_ROUTER_SCORER_WEIGHTS": "queue=2,ttft_slack=0",
                                 "PD_ROUTER_TENANT_SLOS": "gold=300:30", "PD_ROUTER_MODE": "auto"})
    assert [s.name for _, s in build(cfg.weights())] == ["queue"]
    assert cfg.slo_for("gold") == (300.0, 30.0) and cfg.slo_for("other") == (0.0, 0.0)
    with pytest.raises(ValueError, match="unknown scorer 'speed'"):
        RouterConfig(scorer_weights="speed=1")
    with pytest.raises(ValueError, match="tenant_slos entry 'gold=fast'"):
        RouterConfig(tenant_slos="gold=fast")
    with pytest.raises(ValueError, match="canary_fraction"):
        RouterConfig(canary_fraction=1.5)


def test_an_unobserved_route_is_priced_from_the_observed_one():
    model = CostModel(RouterConfig(disaggregated_overhead_ms=5.0, colocated_overhead_ms=1.0, cost_ewma_alpha=0.5))
    model.observe_ttft(Route.COLOCATED, predicted_ms=10.0, observed_ms=50.0)  # 40 ms unmodeled
    assert model.overhead_ms(Route.COLOCATED) == pytest.approx(41.0)
    assert model.overhead_ms(Route.DISAGGREGATED) == pytest.approx(41.0 + 4.0)
    model.observe_ttft(Route.DISAGGREGATED, predicted_ms=45.0, observed_ms=45.0)
    assert model.overhead_ms(Route.DISAGGREGATED) == pytest.approx(45.0)
