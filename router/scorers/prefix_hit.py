"""Prefix hit: the share of the prompt the computing worker does not recompute."""

from __future__ import annotations

from router.candidate import Candidate, ScoreContext
from router.scorers.base import Scorer


class PrefixHit(Scorer):
    """Scale: 1 - compute_tokens / prompt_tokens, in [0, 1): 0 with no usable
    cached prefix at the computing worker (P, or W colocated); the last prompt
    token is always computed, so 1 is never reached. The TTFT prediction
    already prices the hit; this weight only breaks near-ties toward cache reuse."""

    name = "prefix_hit"

    def score(self, c: Candidate, ctx: ScoreContext) -> float:
        if c.prompt_tokens <= 0:
            return 0.0
        return 1.0 - c.compute_tokens / c.prompt_tokens
