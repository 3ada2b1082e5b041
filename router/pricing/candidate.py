"""One priced route for one request: what the decision scores and records.

A candidate is either disaggregated (prefill P, decode D) or colocated (one
worker W in `decode`, `prefill` None). Every time is a prediction in ms from
router/pricing/cost_model.py; `ttft_ms` is the sum of the parts listed below it.

A decision prices its few candidates as plain tuples first (`Row`: the
Candidate fields up to `decode_streams`, in order), scores them all at once from
a `ScoreBatch` of columns, and builds Candidate objects only for the ones it
returns (router/pricing/decision.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from router.types import Route
from runtime.directory.records import WorkerRecord


@dataclasses.dataclass(slots=True)
class Candidate:
    """A route with its predicted TTFT/TPOT and the facts the scorers read."""

    route: Route
    decode: WorkerRecord
    """D, or W for a colocated route."""
    prefill: WorkerRecord | None
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
    disturb_tpot_ms: float = 0.0
    """TPOT of the streams beside this prompt's prefill (colocated W, or a split's P when it
    decodes too) while it runs; 0 when it stalls none (router/pricing/interference.py)."""
    stalled_streams: int = 0
    """Streams the computing worker (W, or a P that decodes too) decodes now, by the
    snapshot plus this router's overlay: the ones this prefill would hold back."""
    decode_streams: int = 0
    """Streams D (W) decodes now, before this request joins (snapshot plus overlay)."""
    score: float = 0.0
    violations: str = ""
    """Why the candidate misses the request's SLOs ("" when it meets them)."""

    @property
    def fits(self) -> bool:
        """D (W) has the blocks free now, by the snapshot plus this router's overlay."""
        return self.free_blocks_after >= 0

    def row(self) -> Row:
        """This candidate as a Row (its fields from `route` to `decode_streams`)."""
        return tuple(getattr(self, f) for f in _ROW_FIELDS)

    def describe(self) -> str:
        """e.g. "disaggregated prefill-0 -> decode-1 (TTFT 120.0 ms, TPOT 8.2 ms)"."""
        where = (f"disaggregated {self.prefill.worker_id} -> {self.decode.worker_id}"
                 if self.route is Route.DISAGGREGATED else f"colocated on {self.decode.worker_id}")
        return f"{where} (predicted TTFT {self.ttft_ms:.1f} ms, TPOT {self.tpot_ms:.2f} ms)"

    def breakdown(self) -> str:
        """The TTFT parts, and a split route's hand-off after its token 0 (in its TPOT), for
        rejection messages and logs."""
        ttft = (f"TTFT = queue {self.queue_ms:.1f} + prefill {self.prefill_ms:.1f} ({self.compute_tokens} "
                f"tokens) + overhead {self.overhead_ms:.1f} ms")
        if self.route is not Route.DISAGGREGATED:
            return ttft
        return (f"{ttft}; then the hand-off in the first token gap: transfer {self.transfer_ms:.1f} "
                f"({self.transfer_bytes} bytes) + admission {self.admission_ms:.1f} ms + the lag")


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class ScoreContext:
    """Per-request facts every scorer may read."""

    slo_ttft_ms: float
    """Target, 0 = none."""
    slo_tpot_ms: float
    best_ttft_ms: float
    """Lowest predicted TTFT over this request's candidates (> 0)."""
    best_tpot_ms: float

    def __init__(self, slo_ttft_ms: float, slo_tpot_ms: float, best_ttft_ms: float, best_tpot_ms: float):
        # Written out (not the generated __init__): this module runs compiled (router/native.py),
        # a dataclass's generated __init__ would not, and one is built per request.
        setattr_ = object.__setattr__
        setattr_(self, "slo_ttft_ms", slo_ttft_ms)
        setattr_(self, "slo_tpot_ms", slo_tpot_ms)
        setattr_(self, "best_ttft_ms", best_ttft_ms)
        setattr_(self, "best_tpot_ms", best_tpot_ms)


Row = tuple
"""A priced candidate as a tuple: Candidate's fields from `route` to `decode_streams`,
in declaration order, so `Candidate(*row)` builds it (score 0, no violations)."""

ROUTE, DECODE, TTFT, TPOT, QUEUE_MS, PREFILL, PROMPT, COMPUTE, QUEUE, FREE_AFTER, DISTURB, STALLED, D_STREAMS = \
    0, 1, 3, 4, 5, 6, 10, 11, 14, 15, 17, 18, 19
"""Positions in a Row. Must match Candidate's field order (asserted below)."""

PREFILL_WORKER = 2
"""Position in a Row of P (None on a colocated route); PREFILL is P's prefill time."""


@dataclasses.dataclass(slots=True, init=False)
class ScoreBatch:
    """The fields scorers read, for all candidates of one request: one sequence per
    field, aligned by candidate index (router/pricing/scorers/base.py)."""

    ttft_ms: Sequence[float]
    tpot_ms: Sequence[float]
    prompt_tokens: Sequence[int]
    compute_tokens: Sequence[int]
    queue_tokens: Sequence[int]
    free_blocks_after: Sequence[int]
    total_blocks: Sequence[int]

    def __init__(self, ttft_ms: Sequence[float], tpot_ms: Sequence[float], prompt_tokens: Sequence[int],
                 compute_tokens: Sequence[int], queue_tokens: Sequence[int], free_blocks_after: Sequence[int],
                 total_blocks: Sequence[int]):
        # Written out: compiled with this module, unlike a generated __init__ (one per request).
        self.ttft_ms, self.tpot_ms, self.prompt_tokens = ttft_ms, tpot_ms, prompt_tokens
        self.compute_tokens, self.queue_tokens = compute_tokens, queue_tokens
        self.free_blocks_after, self.total_blocks = free_blocks_after, total_blocks

    def __len__(self) -> int:
        return len(self.ttft_ms)

    @classmethod
    def of_rows(cls, rows: Sequence[Row]) -> ScoreBatch:
        """The columns of priced rows (one transpose)."""
        # Literal positions (TTFT, TPOT, PROMPT, COMPUTE, QUEUE, FREE_AFTER, FREE_AFTER + 1; asserted
        # below): compiled, a constant index into a tuple is a direct read.
        return cls([r[3] for r in rows], [r[4] for r in rows], [r[10] for r in rows], [r[11] for r in rows],
                   [r[14] for r in rows], [r[15] for r in rows], [r[16] for r in rows])

    @classmethod
    def of(cls, cands: Sequence[Candidate]) -> ScoreBatch:
        """The columns of Candidate objects."""
        return cls([c.ttft_ms for c in cands], [c.tpot_ms for c in cands], [c.prompt_tokens for c in cands],
                   [c.compute_tokens for c in cands], [c.queue_tokens for c in cands],
                   [c.free_blocks_after for c in cands], [c.total_blocks for c in cands])


_ROW_FIELDS = tuple(f.name for f in dataclasses.fields(Candidate))[:D_STREAMS + 1]

assert (TTFT, TPOT, PROMPT, COMPUTE, QUEUE, FREE_AFTER) == (3, 4, 10, 11, 14, 15), "ScoreBatch.of_rows' positions"

assert [f.name for f in dataclasses.fields(Candidate)][:D_STREAMS + 1] == [
    "route", "decode", "prefill", "ttft_ms", "tpot_ms", "queue_ms", "prefill_ms", "transfer_ms", "admission_ms",
    "overhead_ms", "prompt_tokens", "compute_tokens", "transfer_tokens", "transfer_bytes", "queue_tokens",
    "free_blocks_after", "total_blocks",
    "disturb_tpot_ms", "stalled_streams", "decode_streams"]
