"""Prefix hit: the share of the prompt the computing worker does not recompute."""

from __future__ import annotations

from router.pricing.candidate import ScoreBatch, ScoreContext
from router.pricing.scorers.base import Scorer


class PrefixHit(Scorer):
    """Scale: 1 - compute_tokens / prompt_tokens, in [0, 1): 0 with no usable
    cached prefix at the computing worker (P, or W colocated); the last prompt
    token is always computed, so 1 is never reached. The TTFT prediction
    already prices the hit; this weight only breaks near-ties toward cache reuse."""

    name = "prefix_hit"

    def scores(self, batch: ScoreBatch, ctx: ScoreContext) -> list[float]:
        return [0.0 if prompt <= 0 else 1.0 - compute / prompt
                for compute, prompt in zip(batch.compute_tokens, batch.prompt_tokens)]
