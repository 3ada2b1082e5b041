"""Queue: Splitwise's join-the-shortest-queue on pending prefill tokens."""

from __future__ import annotations

from router.pricing.candidate import ScoreBatch, ScoreContext
from router.pricing.scorers.base import Scorer


class Queue(Scorer):
    """Scale: 1 / (1 + pending_tokens / ref_tokens) over the computing worker's
    pending prefill tokens (P, or W colocated): 1 for an idle worker, 0.5 at
    `ref_tokens` queued, toward 0 as the queue grows."""

    name = "queue"

    def __init__(self, ref_tokens: int = 1024):
        assert ref_tokens > 0
        self.ref_tokens = ref_tokens

    def scores(self, batch: ScoreBatch, ctx: ScoreContext) -> list[float]:
        ref = self.ref_tokens
        return [1.0 / (1.0 + q / ref) for q in batch.queue_tokens]
