"""K/V headroom: how much of D's (W's) cache stays free after this request's reservation."""

from __future__ import annotations

from router.pricing.candidate import ScoreBatch, ScoreContext
from router.pricing.scorers.base import Scorer


class KvHeadroom(Scorer):
    """Scale: free blocks after the reservation / total blocks, in [0, 1]; 0 when
    the request does not fit now (or the worker declares no capacity)."""

    name = "kv_headroom"

    def scores(self, batch: ScoreBatch, ctx: ScoreContext) -> list[float]:
        return [0.0 if total <= 0 or free < 0 else (x if (x := free / total) < 1.0 else 1.0)
                for free, total in zip(batch.free_blocks_after, batch.total_blocks)]
