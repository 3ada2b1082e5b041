"""The scorer plugin interface.

A scorer rates candidate routes of one request in [0, 1] (1 = best) and
documents its scale in its class docstring. The decision sums
``weight * score`` over the configured scorers (RouterConfig.scorer_weights);
scorers see only the candidates' fields and the request's ScoreContext, so they
are pure and cheap. They run on every pruned candidate of every request, so the
decision calls `scores` once per request with all its candidates as columns
(a ScoreBatch); `score` rates one Candidate the same way (tests, tools).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

from router.pricing.candidate import Candidate, ScoreBatch, ScoreContext


class Scorer(abc.ABC):
    """Rates candidates in [0, 1]."""

    name: ClassVar[str]
    """Key in RouterConfig.scorer_weights."""

    @abc.abstractmethod
    def scores(self, batch: ScoreBatch, ctx: ScoreContext) -> list[float]:
        """One value in [0, 1] per candidate of `batch`, in its order; higher is better."""

    def score(self, c: Candidate, ctx: ScoreContext) -> float:
        """`scores` of the single candidate `c`."""
        return self.scores(ScoreBatch.of([c]), ctx)[0]


def slack(predicted_ms: Sequence[float], target_ms: float, best_ms: float) -> list[float]:
    """(target - predicted) / target clamped to [0, 1], per prediction; with no
    target (0) the target is twice the best candidate's prediction, so the best
    scores 0.5 and anything twice as slow or worse scores 0."""
    target = target_ms if target_ms > 0 else 2.0 * best_ms
    if target <= 0:
        return [1.0] * len(predicted_ms)
    # min(1.0, max(0.0, x)) without the calls (NaN -> 0.0 as there)
    return [(x if x < 1.0 else 1.0) if (x := 1.0 - p / target) > 0.0 else 0.0 for p in predicted_ms]
