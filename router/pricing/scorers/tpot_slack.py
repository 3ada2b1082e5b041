"""TPOT slack: how far under the TPOT target D's (W's) predicted cadence is,
with this request added to its batch and its queued prefill interleaved."""

from __future__ import annotations

from router.pricing.candidate import ScoreBatch, ScoreContext
from router.pricing.scorers.base import Scorer, slack


class TpotSlack(Scorer):
    """Scale: (slo_tpot - predicted_tpot) / slo_tpot, clamped to [0, 1]; 0 means
    at or over the target. Without a target, the target is 2x the best
    candidate's predicted TPOT (best = 0.5). This is where colocating a long
    prompt pays: its chunks dilate every decode step of W."""

    name = "tpot_slack"

    def scores(self, batch: ScoreBatch, ctx: ScoreContext) -> list[float]:
        return slack(batch.tpot_ms, ctx.slo_tpot_ms, ctx.best_tpot_ms)
