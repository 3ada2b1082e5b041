"""K/V headroom: how much of D's (W's) cache stays free after this request's reservation."""

from __future__ import annotations

from router.candidate import Candidate, ScoreContext
from router.scorers.base import Scorer


class KvHeadroom(Scorer):
    """Scale: free blocks after the reservation / total blocks, in [0, 1]; 0 when
    the request does not fit now (or the worker declares no capacity)."""

    name = "kv_headroom"

    def score(self, c: Candidate, ctx: ScoreContext) -> float:
        if c.total_blocks <= 0 or c.free_blocks_after < 0:
            return 0.0
        return min(1.0, c.free_blocks_after / c.total_blocks)
