"""Interference (router/pricing/interference.py) in the decision, on hand-computed cases.

Round numbers as in tests/support/pricing.py: prefill 1 ms per token, decode
steps of 10 ms per sequence, 1 MB K/V per block at 1000 MB/s plus 1 ms, split
overhead 5 ms, colocated overhead 1 ms. Two mixed workers (either phase).
"""

from __future__ import annotations

import pytest

from router.pricing.cost_model import CostModel
from router.pricing.decision import decide
from router.pricing.interference import (
    colocated_disturb_ms,
    harmful,
    spends_reserve,
    split_disturb_ms,
    stall_per_token_ms,
)
from router.pricing.reference import reference_decide
from router.pricing.routes import price_colocated
from router.pricing.shapes import Outcome, RequestShape
from runtime.directory.records import WorkerRole
from tests.support.pricing import BS, CFG, params, rows, worker


def colocated_harmful(w, own_ms, max_tokens, slo):
    return harmful(colocated_disturb_ms(w, own_ms, max_tokens), slo)


def split_harmful(p, own_ms, max_tokens, slo):
    return harmful(split_disturb_ms(p, own_ms, max_tokens), slo)


def request(ttft_ms: float = 5000, tpot_ms: float = 55, prompt_tokens: int = 1000) -> RequestShape:
    """41 output tokens and, by default, a 1000-token prompt (1000 ms of prefill): beside a
    stream halfway through such an output it adds 1000 / 20 = 50 ms to each of its tokens."""
    return RequestShape(prompt_tokens=prompt_tokens, max_tokens=41, block_size=BS, slo_ttft_ms=ttft_ms,
                        slo_tpot_ms=tpot_ms)


def both(req: RequestShape, *workers):
    """The decision on `workers`, from `decide` and from `reference_decide` (they must agree)."""
    model = CostModel(CFG)
    return [fn(model, rows(model, *workers), req, params()) for fn in (decide, reference_decide)]


def test_stall_is_the_prefill_over_half_the_output():
    assert stall_per_token_ms(1000.0, 41) == pytest.approx(50.0)   # 1000 ms over 20 tokens
    assert stall_per_token_ms(10.0, 1) == pytest.approx(10.0)      # at least one token


def test_long_prompt_is_split_when_colocating_it_would_stall_streams():
    model = CostModel(CFG)
    w0, w1 = worker("w0", WorkerRole.MIXED), worker("w1", WorkerRole.MIXED)
    # 1000 tokens: prefill 1000 ms; a stream beside it (20 tokens left) waits 50 ms per
    # token on top of a 10 ms step = 60 ms > 55 ms target. Colocated is feasible for the
    # request itself (TTFT 1001 ms, TPOT 10 ms: W idle), and would win on TTFT alone.
    req = RequestShape(prompt_tokens=1000, max_tokens=41, block_size=BS, slo_ttft_ms=5000, slo_tpot_ms=55)
    assert colocated_harmful(model.costs(w0), 1000.0, 41, 55.0)
    for fn in (decide, reference_decide):
        dec = fn(model, rows(model, w0, w1), req, params())
        assert dec.outcome is Outcome.DISAGGREGATED, dec.reason
        assert "interference" in dec.reason
        assert dec.best_colocated is not None and not dec.best_colocated.violations
    # With a looser target the same prompt stays colocated (ties stay colocated).
    loose = RequestShape(prompt_tokens=1000, max_tokens=41, block_size=BS, slo_ttft_ms=5000, slo_tpot_ms=65)
    assert decide(model, rows(model, w0, w1), loose, params()).outcome is Outcome.COLOCATED


def test_short_prompt_stays_colocated():
    model = CostModel(CFG)
    w0, w1 = worker("w0", WorkerRole.MIXED), worker("w1", WorkerRole.MIXED)
    req = RequestShape(prompt_tokens=32, max_tokens=41, block_size=BS, slo_ttft_ms=500, slo_tpot_ms=55)
    dec = decide(model, rows(model, w0, w1), req, params())
    assert dec.outcome is Outcome.COLOCATED          # 32 ms / 20 tokens = 1.6 ms of stall


def test_split_prefills_on_the_worker_without_streams():
    model = CostModel(CFG)
    # w0 decodes 3 streams (step 30 ms); w1 decodes none. Prefilling the long prompt on
    # w0 would put 30 + 50 = 80 ms > 55 on w0's streams; on w1 it stalls nobody now.
    # Colocating it is harmful on either (10 + 50 and 30 + 50 > 55); decoding it on w0
    # costs a 40 ms step (batch 4), within the target.
    w0, w1 = worker("w0", WorkerRole.MIXED, batch=3), worker("w1", WorkerRole.MIXED)
    req = RequestShape(prompt_tokens=1000, max_tokens=41, block_size=BS, slo_ttft_ms=5000, slo_tpot_ms=55)
    assert split_harmful(model.costs(w0), 1000.0, 41, 55.0)
    assert not split_harmful(model.costs(w1), 1000.0, 41, 55.0)
    for fn in (decide, reference_decide):
        dec = fn(model, rows(model, w0, w1), req, params())
        assert dec.outcome is Outcome.DISAGGREGATED, dec.reason
        assert (dec.chosen.prefill.worker_id, dec.chosen.decode.worker_id) == ("w1", "w0")


def test_near_saturation_a_short_prompt_is_judged_alike_on_both_routes():
    model = CostModel(CFG)
    # Both mixed workers decode 4 streams (step 40 ms). A 32-token prompt stalls them by
    # 32 / 20 = 1.6 ms either way; one more stream would tip a colocated W to 50 ms.
    w0, w1 = model.costs(worker("w0", WorkerRole.MIXED, batch=4)), model.costs(worker("w1", WorkerRole.MIXED, batch=4))
    assert colocated_harmful(w0, 32.0, 41, 45.0) == split_harmful(w1, 32.0, 41, 45.0) is False


def test_dedicated_prefill_worker_is_never_harmful_and_no_target_means_no_rule():
    model = CostModel(CFG)
    p = model.costs(worker("p", WorkerRole.PREFILL, batch=0))
    assert not split_harmful(p, 1e6, 2, 10.0)
    assert not colocated_harmful(model.costs(worker("w", WorkerRole.MIXED)), 1e6, 2, 0.0)


def test_every_candidate_harmful_falls_back_to_the_plain_choice():
    model = CostModel(CFG)
    # Only decode workers, both busy: every route is colocated and harmful; the
    # decision still admits (the rule ranks, it never rejects).
    d0, d1 = worker("d0", WorkerRole.DECODE, batch=1), worker("d1", WorkerRole.DECODE, batch=2)
    # Own TPOT: d0 20 + 1000/40 = 45, d1 30 + 25 = 55 (feasible at 55); their streams
    # during the prefill: 10 + 50 and 20 + 50 > 55 (harmful).
    req = RequestShape(prompt_tokens=1000, max_tokens=41, block_size=BS, slo_ttft_ms=5000, slo_tpot_ms=55)
    assert all(colocated_harmful(model.costs(w), 1000.0, 41, 55.0) for w in (d0, d1))
    dec = decide(model, rows(model, d0, d1), req, params())
    assert dec.outcome is Outcome.COLOCATED and not dec.chosen.violations


def test_stall_counts_the_prompts_queued_ahead_on_that_worker():
    model = CostModel(CFG)
    # P decodes one stream (step 10 ms) and has 500 prompt tokens queued (500 ms): a
    # 500-token prompt there holds that stream for 1000 ms, over 20 tokens = 50 ms each.
    p = model.costs(worker("p", WorkerRole.MIXED, batch=1, pending=500))
    assert split_disturb_ms(p, 500.0, 41) == pytest.approx(10 + 50)
    assert split_harmful(p, 500.0, 41, 55.0)
    assert not split_harmful(model.costs(worker("q", WorkerRole.MIXED, batch=1)), 500.0, 41, 55.0)  # 10 + 25
    # A colocated W's queue is left out (it holds short prompts as often as long ones).
    assert colocated_disturb_ms(p, 500.0, 41) == pytest.approx(10 + 25)


def test_a_long_prompts_stream_joins_the_decoding_worker_not_the_free_one():
    # Three mixed workers during a burst of long prompts: the previous one prefills on w0
    # (1000 tokens queued) and will decode on w1 (one stream). A 1000-token prompt can
    # prefill calmly on w0 (behind the queue) or w2 (idle). Decoding it on w2 or w0 would
    # leave no worker where the next long prompt prefills without stalling a stream
    # (10 ms step + 1000 / 20 = 60 ms > 55), so its stream joins w1 (step 20 ms).
    w0, w1 = worker("w0", WorkerRole.MIXED, pending=1000), worker("w1", WorkerRole.MIXED, batch=1)
    w2 = worker("w2", WorkerRole.MIXED)
    for dec in both(request(), w0, w1, w2):
        assert dec.outcome is Outcome.DISAGGREGATED, dec.reason
        assert dec.chosen.decode.worker_id == "w1" and dec.chosen.prefill.worker_id == "w2", dec.reason
        assert "stream-free worker" in dec.reason
    # A short prompt runs colocated (it stalls a neighbour by 1.6 ms), but not on w0: w0
    # prefills for others now (1000 ms queued), and a stream there would wait for the next
    # such prefill (1000 ms over 20 tokens: 50 ms on a 10 ms step > 55).
    for dec in both(request(prompt_tokens=32), w0, w1, w2):
        assert dec.outcome is Outcome.COLOCATED and dec.chosen.decode.worker_id == "w2", dec.reason


def test_a_late_first_token_beats_stalling_the_streams_beside_the_prefill():
    # w0 decodes 2 streams (step 20 ms); w1 has 3000 prompt tokens queued and no streams.
    # Colocated on w0 meets the request's own targets (TTFT ~1.1 s, TPOT 30 + 1000/40 =
    # 55 ms) but holds w0's streams at 20 + 1000 / 20 = 70 ms > 60. Split w1 -> w0 stalls
    # nobody and meets TPOT (30 ms), but its first token comes after w1's queue: TTFT
    # ~4 s > 3.5 s. One late first token is cheaper than two stalled streams.
    w0, w1 = worker("w0", WorkerRole.MIXED, batch=2), worker("w1", WorkerRole.MIXED, pending=3000)
    req = request(ttft_ms=3500, tpot_ms=60)
    for dec in both(req, w0, w1):
        assert dec.outcome is Outcome.DISAGGREGATED, dec.reason
        assert (dec.chosen.prefill.worker_id, dec.chosen.decode.worker_id) == ("w1", "w0")
        assert dec.chosen.ttft_ms > 3500 and dec.chosen.tpot_ms <= 60
        assert "misses only TTFT" in dec.reason
        assert dec.best_colocated is not None and not dec.best_colocated.violations
    # With no streams on w0 to stall, the on-time colocated route stands.
    assert all(not dec.chosen.violations for dec in both(req, worker("w0", WorkerRole.MIXED), w1))


def test_when_every_route_stalls_streams_the_fewest_are_stalled():
    # Both mixed workers decode (w0: 1 stream, w1: 3) and no route is calm: a 1000-token
    # prompt stalls w0's stream (10 + 50 ms) or w1's three (30 + 50 ms), past 55 either way.
    # Both splits meet the request's own targets; prefilling on w0 stalls one stream, not three.
    for dec in both(request(), worker("w0", WorkerRole.MIXED, batch=1), worker("w1", WorkerRole.MIXED, batch=3)):
        assert dec.chosen.route is not None and not dec.chosen.violations, dec.reason
        computing = dec.chosen.prefill or dec.chosen.decode
        assert computing.worker_id == "w0", dec.reason


def test_a_rejected_request_is_admitted_past_its_prediction_only_on_a_calm_route():
    # Nothing meets a 1 s TTFT: colocated on w0 (2 streams) comes closest (~1.1 s) but
    # stalls w0's streams (20 + 50 ms > 55); split w1 -> w0 stalls nobody but waits for
    # w1's 3000 queued tokens. Auto's rejection slack may admit only the calm one.
    for dec in both(request(ttft_ms=1000), worker("w0", WorkerRole.MIXED, batch=2),
                    worker("w1", WorkerRole.MIXED, pending=3000)):
        assert dec.outcome is Outcome.REJECT
        assert "colocated on w0" in dec.reason  # the message still names the closest route
        assert [(c.prefill.worker_id, c.decode.worker_id) for c in dec.admissible] == [("w1", "w0")]


def test_a_colocated_stream_on_a_worker_prefilling_for_others_spends_the_reserve():
    model = CostModel(CFG)
    # w0 decodes nothing but has 1000 prompt tokens queued for other workers' streams (it
    # acts as a prefill worker). A short prompt's stream colocated there would wait for
    # w0's next prefill like those: 1000 ms over 20 tokens = 50 ms on top of its cadence.
    req = request(prompt_tokens=32)
    on_w0 = price_colocated(model, model.costs(worker("w0", WorkerRole.MIXED, pending=1000)), req)
    assert spends_reserve(on_w0.row(), req.max_tokens, req.slo_tpot_ms)
    # Not on an idle worker (nothing queued), nor on a decode-only one (never a prefill worker).
    idle = price_colocated(model, model.costs(worker("w1", WorkerRole.MIXED)), req)
    assert not spends_reserve(idle.row(), req.max_tokens, req.slo_tpot_ms)
    decode_only = price_colocated(model, model.costs(worker("d", WorkerRole.DECODE, pending=1000)), req)
    assert not spends_reserve(decode_only.row(), req.max_tokens, req.slo_tpot_ms)
