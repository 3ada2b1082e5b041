"""One priced route for one request: what the decision scores and records.

A candidate is either disaggregated (prefill P, decode D) or colocated (one
worker W in `decode`, `prefill` None). Every time is a prediction in ms from
router/cost_model.py; `ttft_ms` is the sum of the parts listed below it.
"""

from __future__ import annotations

import dataclasses

from router.types import Route, Worker


@dataclasses.dataclass(slots=True)
class Candidate:
    """A route with its predicted TTFT/TPOT and the facts the scorers read."""

    route: Route
    decode: Worker
    """D, or W for a colocated route."""
    prefill: Worker | None
    """P; None for a colocated route."""
    ttft_ms: float
    tpot_ms: float
    queue_ms: float
    """Prefill queued ahead of this request at the computing worker."""
    prefill_ms: float
    """The compute set's forward pass (colocated: plus the decode steps interleaved with its chunks)."""
    transfer_ms: float
    """Exposed K/V transfer of the transfer set; 0 colocated."""
    admission_ms: float
    """Wait for D's next decode iteration after publication; 0 colocated."""
    overhead_ms: float
    """Fixed per-route overhead (RPC hops, reserve, directory), learned online."""
    prompt_tokens: int
    compute_tokens: int
    """Prompt tokens the computing worker runs (prompt minus its usable prefix hit)."""
    transfer_tokens: int
    """Prompt tokens whose K/V moves to D (prompt minus D's usable hit); 0 colocated."""
    transfer_bytes: int
    queue_tokens: int
    """Pending prefill tokens at the computing worker (Splitwise JSQ input)."""
    free_blocks_after: int
    """D's (W's) free blocks once this request's reservation is taken; < 0: does not fit now."""
    total_blocks: int
    score: float = 0.0
    violations: str = ""
    """Why the candidate misses the request's SLOs ("" when it meets them)."""

    @property
    def fits(self) -> bool:
        """D (W) has the blocks free now, by the snapshot plus this router's overlay."""
        return self.free_blocks_after >= 0

    def describe(self) -> str:
        """e.g. "disaggregated prefill-0 -> decode-1 (TTFT 120.0 ms, TPOT 8.2 ms)"."""
        where = (f"disaggregated {self.prefill.worker_id} -> {self.decode.worker_id}"
                 if self.route is Route.DISAGGREGATED else f"colocated on {self.decode.worker_id}")
        return f"{where} (predicted TTFT {self.ttft_ms:.1f} ms, TPOT {self.tpot_ms:.2f} ms)"

    def breakdown(self) -> str:
        """The TTFT parts, for rejection messages and logs."""
        return (f"queue {self.queue_ms:.1f} + prefill {self.prefill_ms:.1f} ({self.compute_tokens} tokens) + "
                f"transfer {self.transfer_ms:.1f} ({self.transfer_bytes} bytes) + admission "
                f"{self.admission_ms:.1f} + overhead {self.overhead_ms:.1f} ms")


@dataclasses.dataclass(frozen=True, slots=True)
class ScoreContext:
    """Per-request facts every scorer may read."""

    slo_ttft_ms: float
    """Target, 0 = none."""
    slo_tpot_ms: float
    best_ttft_ms: float
    """Lowest predicted TTFT over this request's candidates (> 0)."""
    best_tpot_ms: float
