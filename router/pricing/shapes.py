"""What the route decision takes and gives: the request's shape, the tuning, the
decision and its outcome (used by router/pricing/decision.py, the compiled fast path
router/pricing/cost_table.py, the reference router/pricing/reference.py and the planner)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping

from router.pricing.candidate import Candidate
from router.pricing.scorers.base import Scorer
from router.pricing.worker_costs import WorkerCosts


class Outcome(enum.Enum):
    """What the decision says to do with the request."""

    DISAGGREGATED = "disaggregated"
    COLOCATED = "colocated"
    REJECT = "rejected"


@dataclasses.dataclass(frozen=True, slots=True)
class RequestShape:
    """What the decision needs to know about one request."""

    prompt_tokens: int
    max_tokens: int
    block_size: int
    slo_ttft_ms: float = 0.0
    slo_tpot_ms: float = 0.0
    hits: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Worker id -> leading prompt blocks it holds (router/pricing/prefix_index.py)."""

    usable_blocks: int = dataclasses.field(init=False, repr=False, compare=False)
    """Most leading blocks any worker can reuse (the last token is always computed)."""
    prompt_blocks: int = dataclasses.field(init=False, repr=False, compare=False)
    """Blocks the prompt's K/V occupies."""
    need_blocks: int = dataclasses.field(init=False, repr=False, compare=False)
    """Blocks a decode reservation takes: ceil((S + max_tokens - 1) / B)."""

    def __post_init__(self) -> None:
        # Fields, not properties: every priced route reads them (router/pricing/routes.py).
        n, bs, set_ = self.prompt_tokens, self.block_size, object.__setattr__
        set_(self, "usable_blocks", (n - 1) // bs if bs > 0 else 0)
        set_(self, "prompt_blocks", -(-n // bs) if bs > 0 else 0)
        set_(self, "need_blocks", -(-(n + self.max_tokens - 1) // bs) if bs > 0 else 0)


@dataclasses.dataclass(frozen=True, slots=True)
class DecisionParams:
    """Tuning of the decision (from RouterConfig)."""

    scorers: tuple[tuple[float, Scorer], ...]
    top_k: int = 4
    margin: float = 0.05
    decode_prefill_tokens: int = -1
    """Auto mode's limit on prefill work at decode workers (RouterConfig, router/pricing/decision.py
    `by_role`): while any split route is priced, a colocated route on a worker of role
    DECODE is kept only when it computes at most this many prompt tokens and the worker
    has no prefill queued; -1: no limit (the other modes)."""


@dataclasses.dataclass(slots=True)
class Decision:
    """The choice, and the best candidate of each kind (for shadow records and messages)."""

    outcome: Outcome
    chosen: Candidate | None
    best_disaggregated: Candidate | None
    best_colocated: Candidate | None
    reason: str
    admissible: tuple[Candidate, ...] = ()
    """REJECT only: the candidates auto mode may still admit within its rejection
    slack (router/requests/planner.py): the best of each route among those whose prefill
    stalls no decode stream past the TPOT target, when any; else among those
    stalling the fewest live streams. Empty: the best of each route."""


Usable = Callable[[WorkerCosts], bool]
"""Extra per-worker filter (vocab, context length, capacity), applied before pricing."""
