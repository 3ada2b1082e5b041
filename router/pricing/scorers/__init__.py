"""Route scorers, one per file, each rating candidates in [0, 1], a request's
candidates as one batch (see base.py).

`SCORERS` maps a config name to its class; `build(weights)` makes the
weighted list the decision uses (scorers with weight 0 are left out).
"""

from __future__ import annotations

from collections.abc import Mapping

from router.pricing.scorers.base import Scorer
from router.pricing.scorers.kv_headroom import KvHeadroom
from router.pricing.scorers.prefix_hit import PrefixHit
from router.pricing.scorers.queue import Queue
from router.pricing.scorers.tpot_slack import TpotSlack
from router.pricing.scorers.ttft_slack import TtftSlack

SCORERS: dict[str, type[Scorer]] = {cls.name: cls for cls in (TtftSlack, TpotSlack, Queue, KvHeadroom, PrefixHit)}


def build(weights: Mapping[str, float]) -> tuple[tuple[float, Scorer], ...]:
    """(weight, scorer) for every named scorer with a positive weight; KeyError on unknown names."""
    return tuple((w, SCORERS[name]()) for name, w in sorted(weights.items()) if w > 0)


__all__ = ["SCORERS", "Scorer", "build"]
