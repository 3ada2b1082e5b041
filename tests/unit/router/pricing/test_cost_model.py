"""Router cost model: profile evaluation, defaults, EWMA corrections (per size, both
directions, robust overhead) and their bounds; scorer scales; config parsing."""

from __future__ import annotations

import dataclasses

import pytest

from router.config import RouterConfig
from router.pricing.candidate import Candidate, ScoreContext
from router.pricing.cost_model import CLAMP, CostModel
from router.pricing.routes import price_colocated, price_pair
from router.pricing.scorers import SCORERS, build
from router.pricing.shapes import RequestShape
from router.types import Route
from runtime.directory.cost_profile import CostProfile
from runtime.directory.records import LoadReport, WorkerCapacity, WorkerRecord, WorkerRole

PROFILE = CostProfile(prefill_base_ms=2.0, prefill_ms_per_token=0.5, prefill_ms_per_pair=0.001,
                      decode_base_ms=4.0, decode_ms_per_seq=1.0, decode_ms_per_context_token=0.01,
                      kv_bytes_per_block=1000, source="test")


def w(profile=PROFILE, **load) -> WorkerRecord:
    return WorkerRecord("w", WorkerRole.DECODE, "w:1", profile=profile, load=LoadReport(**load),
                        capacity=WorkerCapacity(total_blocks=100, max_decode_batch=4, max_prefill_tokens=128,
                                                block_size=16))


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


def test_each_route_learns_its_own_overhead():
    # Before, the unobserved route was priced from the observed one; now a colocated
    # TTFT corrects W's prefill instead, and a split route's overhead (hand-off set-up,
    # ~200 ms over ucx here) must not be charged to colocated routes.
    model = CostModel(RouterConfig(disaggregated_overhead_ms=5.0, colocated_overhead_ms=1.0, cost_ewma_alpha=0.5))
    model.observe_ttft(Route.DISAGGREGATED, predicted_ms=10.0, observed_ms=12.0)  # 2 ms over: up at 1/4 weight
    assert model.overhead_ms(Route.DISAGGREGATED) == pytest.approx(5.0 + 0.125 * 2.0)
    assert model.overhead_ms(Route.COLOCATED) == pytest.approx(1.0)
    model.observe_ttft(Route.DISAGGREGATED, predicted_ms=45.0, observed_ms=41.0)  # 4 ms under: down at full weight
    assert model.overhead_ms(Route.DISAGGREGATED) == pytest.approx(5.25 - 0.5 * 4.0)


# ---- the `auto` mode pessimism found by bench/goodput.py --quick ----------------
# A burst of long prompts queued at P beyond what the snapshot showed; each TTFT
# residual (~2 s) became "overhead" (the first sample set it, 415 ms after the
# EWMA), and every later 90-token request was priced at ~740 ms and rejected.

def test_queueing_in_ttft_residuals_does_not_become_a_fixed_overhead():
    model = CostModel(RouterConfig(disaggregated_overhead_ms=5.0, cost_ewma_alpha=0.2))
    for _ in range(3):
        model.observe_ttft(Route.DISAGGREGATED, predicted_ms=800.0, observed_ms=2800.0)
    assert model.overhead_ms(Route.DISAGGREGATED) < 10.0  # was 2005 after the first sample
    for _ in range(60):  # a real, steady 30 ms of hops is still learned (the prediction carries the overhead)
        model.observe_ttft(Route.DISAGGREGATED, predicted_ms=100.0 + model.overhead_ms(Route.DISAGGREGATED),
                           observed_ms=130.0)
    assert 25.0 < model.overhead_ms(Route.DISAGGREGATED) <= 30.0
    model.observe_ttft(Route.DISAGGREGATED, predicted_ms=100.0, observed_ms=80.0)  # comes down at full weight
    assert model.overhead_ms(Route.DISAGGREGATED) < 30.0


def test_prefill_correction_is_per_size_and_follows_samples_down():
    model = CostModel(RouterConfig(cost_ewma_alpha=0.5))
    worker = w(PROFILE)
    raw = model.costs(worker)
    long_raw, short_raw = raw.prefill_ms(1024, 0), raw.prefill_ms(90, 0)
    model.observe_prefill(worker, 1024, 0, 2.0 * long_raw)  # long prompts under load: 2x
    assert model.costs(worker).prefill_ms(90, 0) == pytest.approx(2.0 * short_raw)  # nearest observed size
    model.observe_prefill(worker, 90, 0, 0.5 * short_raw)  # short ones: calibration was 2x slow
    row = model.costs(worker)
    assert row.prefill_ms(90, 0) == pytest.approx(0.5 * short_raw)
    assert row.prefill_ms(1024, 0) == pytest.approx(2.0 * long_raw)
    for _ in range(12):
        model.observe_prefill(worker, 1024, 0, 1.0 * long_raw)
    assert model.costs(worker).prefill_ms(1024, 0) == pytest.approx(long_raw, rel=1e-3)  # and back down
    # The cheap bound decision.py prunes with (pre_* coefficients) carries the overall factor.
    assert 0.5 <= model.costs(worker).pre_tok / PROFILE.prefill_ms_per_token <= 2.0


def test_colocated_ttft_corrects_a_pessimistic_calibration():
    # W calibrated while its neighbour started: 2.5x too slow. Colocated routes
    # report no prefill timing, so before, only the (never negative) overhead saw it.
    model = CostModel(RouterConfig(cost_ewma_alpha=0.5, colocated_overhead_ms=1.0))
    worker = dataclasses.replace(w(PROFILE), role=WorkerRole.DECODE)
    req = RequestShape(90, 32, 16, slo_ttft_ms=0.0)
    c = price_colocated(model, model.costs(worker), req)
    true_ms = c.prefill_ms / 2.5 + c.overhead_ms
    model.observe_first_token(c, true_ms)
    again = price_colocated(model, model.costs(worker), req)
    assert again.ttft_ms == pytest.approx(true_ms, rel=1e-6)
    assert model.overhead_ms(Route.COLOCATED) == pytest.approx(1.0)
    # With a queue ahead of it the TTFT is not a prefill sample.
    busy = dataclasses.replace(worker, load=LoadReport(pending_prefill_tokens=2000))
    queued = price_colocated(model, model.costs(busy), req)
    before = model.corrections()["prefill/w"]
    model.observe_first_token(queued, queued.ttft_ms * 3)
    assert model.corrections()["prefill/w"] == before


def test_split_ttft_goes_to_the_overhead_not_the_prefill():
    model = CostModel(RouterConfig(cost_ewma_alpha=0.5))
    p = WorkerRecord("p", WorkerRole.PREFILL, "p:1", profile=PROFILE, capacity=w().capacity)
    d = WorkerRecord("d", WorkerRole.DECODE, "d:1", profile=PROFILE, capacity=w().capacity)
    c = price_pair(model, model.costs(p), model.costs(d), RequestShape(90, 32, 16))
    model.observe_first_token(c, c.ttft_ms + 200.0)  # nothing queued at P: a clean sample sets it
    assert "prefill/p" not in model.corrections()
    assert model.overhead_ms(Route.DISAGGREGATED) == pytest.approx(c.overhead_ms + 200.0)
    busy = dataclasses.replace(p, load=LoadReport(pending_prefill_tokens=3000))
    queued = price_pair(model, model.costs(busy), model.costs(d), RequestShape(90, 32, 16))
    model.observe_first_token(queued, queued.ttft_ms + 2000.0)  # a queue ahead: barely moves
    assert model.overhead_ms(Route.DISAGGREGATED) < c.overhead_ms + 200.0 + 0.5 * 0.25 * 3 * 205.0 + 1e-6


# ---- e2e on `tiny`: the first short colocated request's ~10 ms of RPC was read as
# a 2.5x prefill factor for its size, the split route kept its unobserved 5 ms, and
# the second short request went split (then the split's ~80 ms was learned).

def test_fixed_cost_of_a_short_colocated_ttft_is_overhead_not_prefill():
    model = CostModel(RouterConfig(cost_ewma_alpha=0.5, colocated_overhead_ms=1.0, disaggregated_overhead_ms=5.0))
    tiny = CostProfile(prefill_base_ms=0.5, prefill_ms_per_token=0.2, decode_base_ms=2.0,
                       kv_bytes_per_block=1000, source="test")
    p = WorkerRecord("p", WorkerRole.PREFILL, "p:1", profile=tiny, capacity=w().capacity)
    d = WorkerRecord("d", WorkerRole.DECODE, "d:1", profile=tiny, capacity=w().capacity)
    req = RequestShape(32, 16, 16)
    first = price_colocated(model, model.costs(d), req)
    assert first.prefill_ms == pytest.approx(6.9)  # as on `tiny`: comparable with the fixed costs
    model.observe_first_token(first, first.prefill_ms + 20.0)  # 20 ms of RPC on a 6.9 ms prefill
    assert "prefill/d" not in model.corrections()  # not read as W's prefill being 3.8x slow
    assert model.overhead_ms(Route.COLOCATED) == pytest.approx(20.0)
    again = price_colocated(model, model.costs(d), req)
    assert again.ttft_ms == pytest.approx(first.prefill_ms + 20.0)
    # The split route, never observed: its token 0 makes the same hops (through P, not W),
    # never cheaper; the hand-off comes after it, in the first token gap.
    split = price_pair(model, model.costs(p), model.costs(d), req)
    assert split.overhead_ms == pytest.approx(20.0) and split.ttft_ms == pytest.approx(again.ttft_ms)
    # Once observed, the split route's own (larger) overhead prices it.
    model.observe_first_token(split, split.ttft_ms + 60.0)
    assert model.overhead_ms(Route.DISAGGREGATED) == pytest.approx(80.0)
    assert model.overhead_ms(Route.COLOCATED) == pytest.approx(20.0)


def test_decode_price_confirmed_only_by_several_agreeing_streams():
    model = CostModel(RouterConfig(cost_ewma_alpha=0.5))
    worker = w()
    assert not model.decode_confirmed("w") and model.observed_tpot_ms("w") is None
    for ms in (10.0, 40.0, 12.0):  # implied factors 1, 4, 1.2: they disagree
        model.observe_tpot(worker, 10.0, ms, carried=1.0)
    assert not model.decode_confirmed("w") and model.observed_tpot_ms("w") == 12.0
    for ms in (20.0, 21.0, 19.0):
        model.observe_tpot(worker, 10.0, ms, carried=1.0)
    assert model.decode_confirmed("w")


def test_a_stream_that_saw_later_arrivals_bounds_the_decode_price_from_above():
    model = CostModel(RouterConfig(cost_ewma_alpha=0.5))
    worker = w()
    model.observe_tpot(worker, 10.0, 120.0, carried=1.0, clean=False)  # 12x: dilated by later prompts
    assert model.decode_factor("w") == pytest.approx(1.0 + 0.5 * 0.25 * 3.0)  # a quarter step, capped at 4x
    model.observe_tpot(worker, 10.0, 8.0, carried=1.0, clean=False)  # below the price: full step down
    assert model.decode_factor("w") == pytest.approx(1.375 + 0.5 * (0.8 - 1.375))
    model.observe_tpot(worker, 10.0, 30.0, carried=1.0)  # a clean stream: plain EWMA step
    assert model.decode_factor("w") == pytest.approx(0.5 * 1.0875 + 0.5 * 3.0)


def test_sequences_the_router_gives_back_leave_the_live_streams_too():
    """A report taken during a request that has ended since (the overlay gives its sequence
    back, router/requests/placement.py): neither the batch nor the streams decoding now
    count it; this router's own started streams still do."""
    model = CostModel(RouterConfig())
    stale = w(active_decode_batch=1, active_context_tokens=48)
    ended = model.costs(stale, extra_seqs=-1, streams=(0, 0, float("inf")))
    assert (ended.batch, ended.live) == (0, 0)
    as_reported = model.costs(stale, streams=(0, 0, float("inf")))
    assert (as_reported.batch, as_reported.live) == (1, 1)
    new_one = model.costs(stale, extra_seqs=1, streams=(0, 0, float("inf")))  # dispatched, not yet live
    assert (new_one.batch, new_one.live) == (2, 1)
    own = model.costs(stale, extra_seqs=-1, streams=(2, 0, float("inf")))
    assert own.live == 2


def test_cached_rows_follow_their_own_workers_corrections_and_carry_the_streams():
    """`costs` keeps a worker's row while neither its record nor its own corrections
    change, and folds this router's streams into a copy: every field equals a row built
    from scratch, before and after a correction of that worker, and another worker's
    correction leaves its row cached."""
    model = CostModel(RouterConfig(cost_ewma_alpha=0.5))
    a = w(pending_prefill_tokens=40, active_decode_batch=2, active_context_tokens=300)
    b = dataclasses.replace(a, worker_id="b")

    def fresh(record, streams=None):
        return model._build(record, 0, 0, 0, streams)

    def same(x, y):
        return all(getattr(x, f.name) == getattr(y, f.name) for f in dataclasses.fields(x))

    first = model.costs(a)
    assert model.costs(a) is first and same(first, fresh(a))
    for streams in ((3, 1, 250.0), (0, 2, 0.0), (1, 0, float("inf"))):
        row = model.costs(a, streams=streams)
        assert row is not first and same(row, fresh(a, streams))
        assert (row.live, row.planned, row.next_start_ms) == (max(2, streams[0]), streams[1], streams[2])
    assert first.live == 2 and first.planned == 0  # the cached row itself is untouched
    kept_b = model.costs(b)
    model.observe_prefill(a, 100, 0, 10 * first.prefill_ms(100, 0))
    model.observe_tpot(a, 10.0, 30.0)
    after = model.costs(a, streams=(1, 1, 5.0))
    assert same(after, fresh(a, (1, 1, 5.0))) and after.pre_tok > first.pre_tok and after.dec_base > first.dec_base
    assert model.costs(b) is kept_b


def test_what_confirms_a_price_for_a_rejection_expires():
    """An overload's streams confirm a high decode price, and a completion a prefill price,
    for `reject_evidence_s`; after that (nothing executed on those workers meanwhile: every
    request was rejected) they confirm nothing, so auto mode admits again and the next
    completions correct the prices. The factors themselves stay as they were."""
    now = [100.0]
    model = CostModel(RouterConfig(cost_ewma_alpha=0.5, reject_evidence_s=30.0), clock=lambda: now[0])
    worker = w()
    for ms in (60.0, 62.0, 58.0):  # 6x the price, three agreeing streams
        model.observe_tpot(worker, 10.0, ms, carried=1.0)
    model.observe_prefill(worker, 100, 0, 500.0)
    col = price_colocated(model, model.costs(worker), RequestShape(100, 8, 16, 0, 0))
    assert model.decode_confirmed("w") and model.observed_tpot_ms("w") == 60.0 and model.prefill_confirmed(col)
    now[0] += 29.0
    assert model.decode_confirmed("w") and model.prefill_confirmed(col)
    factor = model.decode_factor("w")
    now[0] += 2.0
    assert not model.decode_confirmed("w") and model.observed_tpot_ms("w") is None
    assert not model.prefill_confirmed(col) and not model.confirmed(col)
    assert model.decode_factor("w") == factor
    model.observe_tpot(worker, 10.0, 11.0, carried=1.0)  # one fresh stream: not yet several
    assert not model.decode_confirmed("w") and model.observed_tpot_ms("w") == 11.0
