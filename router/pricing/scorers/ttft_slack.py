"""TTFT slack: how far under the request's TTFT target the route's prediction is."""

from __future__ import annotations

from router.pricing.candidate import ScoreBatch, ScoreContext
from router.pricing.scorers.base import Scorer, slack


class TtftSlack(Scorer):
    """Scale: (slo_ttft - predicted_ttft) / slo_ttft, clamped to [0, 1]; 0 means
    at or over the target. Without a target, the target is 2x the best
    candidate's predicted TTFT (best = 0.5)."""

    name = "ttft_slack"

    def scores(self, batch: ScoreBatch, ctx: ScoreContext) -> list[float]:
        return slack(batch.ttft_ms, ctx.slo_ttft_ms, ctx.best_ttft_ms)
