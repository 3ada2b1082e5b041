"""Scorer batch API: `scores` over a ScoreBatch rates each candidate as `score`
rates it alone, stays in [0, 1], and the decision's weighted sum is the plain
sum([weight * score ...]) per candidate; a ScoreBatch of priced Rows holds the
same columns as one of the Candidates built from them."""

from __future__ import annotations

import random

import pytest

from router.pricing.candidate import Candidate, ScoreBatch, ScoreContext
from router.pricing.decision import weighted_scores
from router.pricing.scorers import SCORERS, build
from router.pricing.shapes import RequestShape
from router.types import Route
from runtime.directory.records import WorkerCapacity, WorkerRecord, WorkerRole

W = WorkerRecord("w", WorkerRole.MIXED, "w:1", capacity=WorkerCapacity(total_blocks=100))


def random_candidate(rng: random.Random) -> Candidate:
    prompt = rng.choice((0, 1, rng.randrange(1, 4000)))
    total = rng.choice((0, 100, 4096))
    return Candidate(
        rng.choice((Route.COLOCATED, Route.DISAGGREGATED)), W, None, rng.choice((0.0, rng.uniform(0, 5000), 1e12)),
        rng.choice((0.0, rng.uniform(0, 300), 1e12)), 0.0, 0.0, 0.0, 0.0, 0.0, prompt, rng.randrange(0, prompt + 1),
        0, 0, rng.choice((0, rng.randrange(0, 10**6))), rng.randrange(-50, total + 1), total)


def contexts(rng: random.Random, cands: list[Candidate]) -> list[ScoreContext]:
    best_ttft, best_tpot = min(c.ttft_ms for c in cands), min(c.tpot_ms for c in cands)
    return [ScoreContext(0.0, 0.0, best_ttft, best_tpot),
            ScoreContext(rng.uniform(1, 3000), rng.uniform(1, 200), best_ttft, best_tpot)]


@pytest.mark.parametrize("seed", range(20))
def test_batch_scores_equal_single_scores_and_stay_in_unit_interval(seed):
    rng = random.Random(seed)
    cands = [random_candidate(rng) for _ in range(rng.randrange(1, 12))]
    batch = ScoreBatch.of(cands)
    assert len(batch) == len(cands)
    for ctx in contexts(rng, cands):
        for name, cls in SCORERS.items():
            got = cls().scores(batch, ctx)
            assert got == [cls().score(c, ctx) for c in cands], name
            assert all(0.0 <= x <= 1.0 for x in got), name


@pytest.mark.parametrize("seed", range(20))
def test_weighted_scores_are_the_plain_weighted_sum(seed):
    rng = random.Random(seed)
    cands = [random_candidate(rng) for _ in range(rng.randrange(1, 12))]
    req = RequestShape(100, 16, 16, rng.choice((0.0, 500.0)), rng.choice((0.0, 50.0)))
    scorers = build({name: rng.choice((0.0, rng.uniform(0.1, 3))) for name in SCORERS})
    ctx = ScoreContext(req.slo_ttft_ms, req.slo_tpot_ms, min(c.ttft_ms for c in cands), min(c.tpot_ms for c in cands))
    want = [sum([w * s.score(c, ctx) for w, s in scorers]) for c in cands]
    assert weighted_scores(ScoreBatch.of(cands), req, scorers) == want


def test_batch_of_rows_matches_batch_of_candidates():
    rng = random.Random(3)
    cands = [random_candidate(rng) for _ in range(6)]
    rows = [(c.route, c.decode, c.prefill, c.ttft_ms, c.tpot_ms, c.queue_ms, c.prefill_ms, c.transfer_ms,
             c.admission_ms, c.overhead_ms, c.prompt_tokens, c.compute_tokens, c.transfer_tokens, c.transfer_bytes,
             c.queue_tokens, c.free_blocks_after, c.total_blocks) for c in cands]
    assert [Candidate(*r) for r in rows] == cands
    by_rows, by_cands = ScoreBatch.of_rows(rows), ScoreBatch.of(cands)
    for field in ScoreBatch.__slots__:
        assert list(getattr(by_rows, field)) == list(getattr(by_cands, field)), field
