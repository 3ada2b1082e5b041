"""One worker's price row: its corrected cost coefficients and load-dependent terms,
folded by `CostModel.costs` (router/pricing/cost_model.py) so that pricing a route is a
few multiply-adds (router/pricing/decision.py, the compiled fast path router/pricing/cost_table.py)."""

from __future__ import annotations

import dataclasses
import math

from router.pricing.corrections import SIZE_BUCKETS
from router.types import Worker


@dataclasses.dataclass(slots=True)
class WorkerCosts:
    """One worker's corrected coefficients and its load-dependent terms."""

    worker: Worker
    pre_base: float
    pre_tok: float
    pre_pair: float
    dec_base: float
    dec_seq: float
    dec_ctx: float
    kv_bytes_per_block: int
    pending_tokens: int
    """Pending prefill tokens (heartbeat + this router's unreported dispatches)."""
    free_blocks: int
    """Free blocks (heartbeat + overlay); may be negative."""
    batch: int
    context: int
    chunk_tokens: int
    max_batch: int
    queue_ms: float = 0.0
    """Time to drain the pending prefill tokens."""
    step_ms: float = 0.0
    """One decode step of the current batch (0 when idle)."""
    admission_ms: float = 0.0
    """Wait for the next loop iteration once a hand-off is published."""
    tpot_base: float = 0.0
    tpot_per_token: float = 0.0
    """tpot_with = tpot_base + tpot_per_token * (prompt + max_tokens // 2) + queue spread (precomputed)."""
    can_prefill: bool = False
    can_decode: bool = False
    live: int = -1
    """Streams decoding now: the heartbeat's batch, or the streams this router saw start
    here when more (router/requests/streams.py); -1 (the default): `batch`."""
    planned: int = 0
    """Streams this router planned here that have not started yet (router/requests/streams.py)."""
    next_start_ms: float = math.inf
    """When the first planned stream is expected to start, ms from now (0: due now)."""
    pre_scale: tuple[float, ...] = ()
    """Per size bucket of new tokens: that bucket's prefill correction / the worker's
    overall one (pre_* carry the overall factor; the cheap bound in decision.py uses them)."""

    def __post_init__(self) -> None:
        self.queue_ms = self.prefill_linear_ms(self.pending_tokens)
        self.step_ms = self.decode_step_ms(self.batch, self.context) if self.batch else 0.0
        self.admission_ms = self.step_ms + self.prefill_linear_ms(min(self.pending_tokens, self.chunk_tokens))
        rounds = -(-(self.batch + 1) // self.max_batch) if self.max_batch else 1
        self.tpot_base = self.decode_step_ms(self.batch + 1, self.context) * rounds
        self.tpot_per_token = self.dec_ctx * rounds
        self.can_prefill, self.can_decode = self.worker.can_prefill, self.worker.can_decode
        if self.live < 0:
            self.live = self.batch

    def overlap_ms(self, prefill_ms: float, end_ms: float) -> float:
        """How much of a prefill of `prefill_ms` ending `end_ms` from now runs while a
        stream here decodes: all of it with live streams, else what runs after the
        first planned stream starts (0 when it ends before)."""
        if self.live > 0:
            return prefill_ms
        if self.planned <= 0 or end_ms <= self.next_start_ms:
            return 0.0
        return min(prefill_ms, end_ms - self.next_start_ms)

    def colocated_key(self, n: int, reused: int, tpot_ms: float, gaps: int, overhead_ms: float, ttft_ref: float,
                      tpot_ref: float) -> float:
        """The colocated route's pruning key here for a prompt of `n` tokens reusing
        `reused`: TTFT and TPOT, each over its reference, the TPOT (`tpot_ms`, from
        tpot_with without extra prefill) with the part of the prompt's own prefill that
        overlaps this worker's streams spread over `gaps` tokens. The definition in
        router/pricing/reference.py `reference_candidates`; router/pricing/cost_table.py keys prefix hits
        and planned-only streams with it, and every other row in its columnar pass."""
        new = n - reused
        own = self.prefill_ms(new, reused)
        ttft = self.queue_ms + own + -(-new // self.chunk_tokens) * self.step_ms + overhead_ms
        end = self.queue_ms + self.interleaved_ms(own, new)
        return ttft / ttft_ref + (tpot_ms + self.overlap_ms(own, end) / gaps) / tpot_ref

    def prefill_ms(self, new: int, reused: int) -> float:
        """Forward pass over `new` prompt tokens after `reused` cached ones."""
        if new <= 0:
            return 0.0
        scale = self.pre_scale[min(new.bit_length(), SIZE_BUCKETS - 1)] if self.pre_scale else 1.0
        return (self.pre_base + self.pre_tok * new + self.pre_pair * new * (reused + new / 2.0)) * scale

    def interleaved_ms(self, own_ms: float, new: int) -> float:
        """A prefill of `new` tokens that takes `own_ms` alone, with one decode step of this
        worker's batch between its chunks (the engine loop's chunked prefill; 0 when idle)."""
        return own_ms + -(-new // self.chunk_tokens) * self.step_ms

    def prefill_linear_ms(self, tokens: int) -> float:
        """Queued prompt work of unknown shape: base + per-token cost (no pair term)."""
        return self.pre_base + self.pre_tok * tokens if tokens > 0 else 0.0

    def decode_step_ms(self, batch: int, context: int) -> float:
        """One decode step over `batch` sequences attending over `context` tokens in total."""
        return self.dec_base + self.dec_seq * batch + self.dec_ctx * context

    def tpot_with(self, prompt_tokens: int, max_tokens: int, extra_prefill_ms: float = 0.0) -> float:
        """Cadence of this worker's streams with one more request of this shape:
        a step over batch + 1 (rotated when over max_batch), plus the prefill work
        queued here (and `extra_prefill_ms`) spread over the request's tokens."""
        return (self.tpot_base + self.tpot_per_token * (prompt_tokens + max_tokens // 2)
                + (self.queue_ms + extra_prefill_ms) / max(1, max_tokens - 1))
