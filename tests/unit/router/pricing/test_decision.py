"""The per-request decision on hand-computed cases (docs/architecture.md, Router: cost model, decision, modes),
over the round-number workers of tests/support/pricing.py.
"""

from __future__ import annotations

import pytest

from router.pricing.cost_model import CostModel
from router.pricing.decision import decide
from router.pricing.reference import reference_decide
from router.pricing.routes import price_colocated, price_pair
from router.pricing.shapes import Outcome, RequestShape
from runtime.directory.records import WorkerCapacity, WorkerRecord, WorkerRole
from tests.support.pricing import BS, CFG, PROFILE, params, rows, worker


def test_longer_prefix_hit_loses_to_shorter_queue():
    model = CostModel(CFG)
    p1, p2 = worker("p1", WorkerRole.PREFILL), worker("p2", WorkerRole.PREFILL, pending=1000)
    d = worker("d", WorkerRole.DECODE)
    req = RequestShape(prompt_tokens=128, max_tokens=8, block_size=BS, hits={"p2": 8})
    # p2 reuses 7 blocks (usable = (128-1)//16): queue 1000 + prefill 16 = 1016 ms;
    # p1 computes all 128 tokens with nothing queued: 128 ms.
    dec = decide(model, rows(model, p1, p2, d), req, params(), colocated=False)
    assert dec.outcome is Outcome.DISAGGREGATED and dec.chosen.prefill.worker_id == "p1"
    # TTFT (token 0 from P) = queue 0 + prefill 128 + overhead 5; TPOT = the step (10 ms)
    # + the hand-off (transfer 1 + 8 blocks x 1 ms, admission 0, lag 5) over 7 token gaps.
    assert dec.chosen.ttft_ms == pytest.approx(128 + 5)
    assert dec.chosen.tpot_ms == pytest.approx(10 + (9 + 0 + 5) / 7)
    loser = price_pair(model, model.costs(p2), model.costs(d), req)
    assert loser.compute_tokens == 16 and loser.ttft_ms == pytest.approx(1000 + 16 + 5)


def test_overloaded_decode_rejects_before_prefill_with_numbers():
    model = CostModel(CFG)
    p = worker("p", WorkerRole.PREFILL)
    d0, d1 = worker("d0", WorkerRole.DECODE, batch=7), worker("d1", WorkerRole.DECODE, batch=11)
    req = RequestShape(prompt_tokens=64, max_tokens=8, block_size=BS, slo_tpot_ms=100.0)
    # TPOT = 10 ms x (batch + 1) + the hand-off over 7 gaps: transfer 1 + 4 blocks, the
    # admission (the current step: 10 ms x batch), lag 5. d0 -> 80 + 80 / 7 = 91.43 ms
    # (admitted), d1 -> 120 + 120 / 7 = 137.14 ms.
    dec = decide(model, rows(model, p, d0, d1), req, params(), colocated=False)
    assert dec.outcome is Outcome.DISAGGREGATED and dec.chosen.decode.worker_id == "d0"
    assert dec.chosen.tpot_ms == pytest.approx(80.0 + (5 + 70 + 5) / 7)
    overloaded = decide(model, rows(model, p, d1), req, params(), colocated=False)
    assert overloaded.outcome is Outcome.REJECT and overloaded.chosen is None
    assert "TPOT 137.14 ms > SLO 100 ms" in overloaded.reason
    assert "p -> d1" in overloaded.reason


def test_compute_set_differs_from_transfer_set():
    model = CostModel(CFG)
    p, d = worker("p", WorkerRole.PREFILL), worker("d", WorkerRole.DECODE)
    req = RequestShape(prompt_tokens=128, max_tokens=8, block_size=BS, hits={"p": 4, "d": 6})
    c = price_pair(model, model.costs(p), model.costs(d), req)
    assert c.compute_tokens == 128 - 4 * BS          # P lacks blocks 4..7
    assert c.transfer_tokens == 2 * BS               # D lacks only blocks 6..7
    assert c.transfer_bytes == 2 * 1_000_000
    assert c.prefill_ms == pytest.approx(64.0) and c.transfer_ms == pytest.approx(1 + 2)


def test_usable_prefix_never_covers_the_last_token():
    model = CostModel(CFG)
    p, d = worker("p", WorkerRole.PREFILL), worker("d", WorkerRole.DECODE)
    req = RequestShape(prompt_tokens=64, max_tokens=4, block_size=BS, hits={"p": 4, "d": 4})
    c = price_pair(model, model.costs(p), model.costs(d), req)
    assert c.compute_tokens == BS and c.transfer_tokens == BS  # usable = (64-1)//16 = 3 blocks


def test_short_prompt_on_an_idle_decode_runs_colocated_long_prompt_beside_streams_splits():
    model = CostModel(CFG)
    p, idle = worker("p", WorkerRole.PREFILL), worker("d", WorkerRole.DECODE)
    short = RequestShape(prompt_tokens=32, max_tokens=33, block_size=BS)
    dec = decide(model, rows(model, p, idle), short, params())
    # Colocated: TTFT 32 + 1, TPOT 10; split: TTFT 32 + 5, TPOT 10 + (3 + 5) / 32.
    assert dec.outcome is Outcome.COLOCATED and dec.chosen.decode.worker_id == "d"
    assert (dec.chosen.ttft_ms, dec.best_disaggregated.ttft_ms) == (pytest.approx(33), pytest.approx(37))
    d = worker("d", WorkerRole.DECODE, batch=2)
    # Beside 2 streams, the colocated prefill runs with one 20 ms step between its chunks (TTFT
    # 32 + 20 + 1) and dilates them; the split's token 0 comes from P, its hand-off spreads over
    # its 32 gaps.
    beside = decide(model, rows(model, p, d), short, params())
    assert beside.outcome is Outcome.DISAGGREGATED, beside.reason
    long = RequestShape(prompt_tokens=1024, max_tokens=33, block_size=BS)
    dec = decide(model, rows(model, p, d), long, params())
    assert dec.outcome is Outcome.DISAGGREGATED, dec.reason
    col = dec.best_colocated
    # W has 2 streams: its step is 30 ms with this request, plus the 1024 ms prompt
    # spread over 32 token gaps = 32 ms of dilation.
    assert col.tpot_ms == pytest.approx(30 + 1024 / 32)
    # TTFT colocated: prefill 1024 + 4 chunks x one 20 ms step of the batch + 1.
    assert col.ttft_ms == pytest.approx(1024 + 4 * 20 + 1)
    # Split: the step with 2 streams (30 ms) + the hand-off over 32 gaps (transfer 1 + 64
    # blocks, admission: the current 20 ms step, lag 5).
    assert dec.chosen.tpot_ms == pytest.approx(30 + (65 + 20 + 5) / 32)


def test_ties_stay_colocated_within_margin():
    model = CostModel(CFG)
    p, d = worker("p", WorkerRole.PREFILL), worker("d", WorkerRole.DECODE)
    req = RequestShape(prompt_tokens=32, max_tokens=8, block_size=BS)
    dec = decide(model, rows(model, p, d), req, params(margin=10.0))
    assert dec.outcome is Outcome.COLOCATED and dec.best_disaggregated is not None


def test_decode_without_room_is_avoided_when_another_fits():
    model = CostModel(CFG)
    p = worker("p", WorkerRole.PREFILL)
    full, roomy = worker("d0", WorkerRole.DECODE, free=2), worker("d1", WorkerRole.DECODE, batch=3)
    req = RequestShape(prompt_tokens=64, max_tokens=64, block_size=BS)
    dec = decide(model, rows(model, p, full, roomy), req, params(), colocated=False)
    assert dec.chosen.decode.worker_id == "d1"
    assert price_pair(model, model.costs(p), model.costs(full), req).fits is False


def test_ttft_slo_rejects_when_queue_too_long_everywhere():
    model = CostModel(CFG)
    p, d = worker("p", WorkerRole.PREFILL, pending=5000), worker("d", WorkerRole.DECODE, pending=5000)
    req = RequestShape(prompt_tokens=100, max_tokens=8, block_size=BS, slo_ttft_ms=500)
    dec = decide(model, rows(model, p, d), req, params())
    assert dec.outcome is Outcome.REJECT
    assert "TTFT" in dec.reason and "> SLO 500 ms" in dec.reason and "queue 5000.0" in dec.reason


def test_abi_mismatch_and_self_pairs_are_never_candidates():
    model = CostModel(CFG)
    both = WorkerRecord("b", WorkerRole.MIXED, "b:1", cache_abi_digest="abi", profile=PROFILE,
                        capacity=WorkerCapacity(total_blocks=100, block_size=BS, max_prefill_tokens=256))
    other = WorkerRecord("d", WorkerRole.DECODE, "d:1", cache_abi_digest="other", profile=PROFILE,
                         capacity=WorkerCapacity(total_blocks=100, block_size=BS))
    req = RequestShape(prompt_tokens=32, max_tokens=4, block_size=BS)
    dec = decide(model, rows(model, both, other), req, params())
    assert dec.best_disaggregated is None and dec.outcome is Outcome.COLOCATED


def test_pruning_keeps_the_best_pair_among_many_workers():
    model = CostModel(CFG)
    ws = [worker(f"p{i}", WorkerRole.PREFILL, pending=100 * (i + 1)) for i in range(20)]
    ws += [worker(f"d{i}", WorkerRole.DECODE, batch=i + 1) for i in range(20)]
    ws.append(worker("p-idle", WorkerRole.PREFILL))
    ws.append(worker("d-idle", WorkerRole.DECODE))
    req = RequestShape(prompt_tokens=256, max_tokens=16, block_size=BS)
    dec = decide(model, rows(model, *ws), req, params(top_k=2), colocated=False)
    assert (dec.chosen.prefill.worker_id, dec.chosen.decode.worker_id) == ("p-idle", "d-idle")


def test_colocated_price_by_hand():
    model = CostModel(CFG)
    w = worker("w", WorkerRole.DECODE, pending=100, batch=1)
    req = RequestShape(prompt_tokens=300, max_tokens=11, block_size=BS)
    c = price_colocated(model, model.costs(w), req)
    # queue 100; own prefill 300 + 2 chunks (256 tokens each) x 10 ms step; overhead 1.
    assert c.ttft_ms == pytest.approx(100 + 300 + 2 * 10 + 1)
    # step with 2 sequences 20 ms + (queue 100 + own 300) / 10 token gaps.
    assert c.tpot_ms == pytest.approx(20 + 400 / 10)


def test_colocated_prompt_behind_a_queued_burst_prompt_dilates_it():
    # bench/goodput.py --quick, `long`: a cold burst of long prompts; the first went
    # colocated on an idle W, and the next was priced as slowing nobody although
    # the first (in this router's overlay, not yet in a heartbeat) is queued there.
    model = CostModel(CFG)
    p, w = worker("p", WorkerRole.PREFILL), worker("w", WorkerRole.DECODE)
    req = RequestShape(prompt_tokens=128, max_tokens=9, block_size=BS, slo_tpot_ms=30.0)
    idle = price_colocated(model, model.costs(w), req)
    assert idle.tpot_ms == pytest.approx(10.0)  # nothing to disturb: one step of batch 1
    # One earlier 128-token prompt of the burst dispatched to W: queue 128 ms, batch still 0,
    # its stream planned (router/requests/streams.py) to start once its prefill is done, at 128 ms.
    queued = model.costs(w, extra_tokens=128, extra_blocks=9, streams=(0, 1, 128.0))
    assert queued.batch == 0 and queued.queue_ms == pytest.approx(128.0)
    # TPOT = 10 + (queue 128 + own prefill 128) / 8 gaps = 42 ms (was 10 + 128 / 8 = 26).
    assert price_colocated(model, queued, req).tpot_ms == pytest.approx(42.0)
    # Queued prompts whose streams decode elsewhere (W prefills them for a split) dilate nobody here.
    for_others = model.costs(w, extra_tokens=128)
    assert price_colocated(model, for_others, req).tpot_ms == pytest.approx(10.0 + 128 / 8)
    # The split route leaves W's cadence at 10 + 128 / 8 = 26 ms, but its decode joins W's
    # batch only after W's current chunk (the queued 128-token prompt: admission 128 ms), so its
    # first gap holds that and the hand-off (transfer 1 + 8 blocks, lag 5): 26 + 142 / 8 = 43.75
    # ms > 30 too (the old single-clock price put the 128 ms in its TTFT, unconstrained here).
    snapshot = [model.costs(p), queued]
    dec = decide(model, snapshot, req, params())
    assert dec.outcome is Outcome.REJECT
    assert dec.best_disaggregated.tpot_ms == pytest.approx(26.0 + 142 / 8)
    assert dec.best_colocated.violations == "TPOT 42.00 ms > SLO 30 ms"
    ref = reference_decide(model, snapshot, req, params())
    assert (ref.outcome, ref.reason) == (dec.outcome, dec.reason)


def test_a_split_routes_hand_off_is_in_its_token_gaps_and_a_one_token_request_has_none():
    model = CostModel(CFG)
    p, d = worker("p", WorkerRole.PREFILL), worker("d", WorkerRole.DECODE, batch=1)
    for m, gap_share in ((9, 1 / 8), (2, 1.0), (1, 0.0)):
        req = RequestShape(prompt_tokens=64, max_tokens=m, block_size=BS)
        c = price_pair(model, model.costs(p), model.costs(d), req)
        # TTFT: token 0 from P (prefill 64 + overhead 5); the hand-off (transfer 1 + 4 blocks,
        # admission: the current 10 ms step, lag 5) before the decode's stream, in its gaps.
        assert c.ttft_ms == pytest.approx(64 + 5)
        assert c.tpot_ms == pytest.approx(20 + (5 + 10 + 5) * gap_share), m
        ref = reference_decide(model, rows(model, p, d), req, params(), colocated=False)
        dec = decide(model, rows(model, p, d), req, params(), colocated=False)
        assert (ref.chosen.ttft_ms, ref.chosen.tpot_ms) == (dec.chosen.ttft_ms, dec.chosen.tpot_ms) == \
            (c.ttft_ms, c.tpot_ms)
