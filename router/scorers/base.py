"""The scorer plugin interface.

A scorer rates one candidate route of one request in [0, 1] (1 = best) and
documents its scale in its class docstring. The decision sums
``weight * score`` over the configured scorers (RouterConfig.scorer_weights);
scorers see only the candidate and the request's ScoreContext, so they are
pure and cheap (they run on every pruned candidate of every request).
"""

from __future__ import annotations

import abc
from typing import ClassVar

from router.candidate import Candidate, ScoreContext


class Scorer(abc.ABC):
    """Rates a candidate in [0, 1]."""

    name: ClassVar[str]
    """Key in RouterConfig.scorer_weights."""

    @abc.abstractmethod
    def score(self, c: Candidate, ctx: ScoreContext) -> float:
        """A value in [0, 1]; higher is better."""


def slack(predicted_ms: float, target_ms: float, best_ms: float) -> float:
    """(target - predicted) / target clamped to [0, 1]; with no target (0) the
    target is twice the best candidate's prediction, so the best scores 0.5 and
    anything twice as slow or worse scores 0."""
    target = target_ms if target_ms > 0 else 2.0 * best_ms
    if target <= 0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - predicted_ms / target))
