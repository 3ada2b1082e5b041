"""One worker's price row: its corrected cost coefficients and load-dependent terms,
folded by `CostModel.costs` (router/pricing/cost_model.py) so that pricing a route is a
few terms of router/pricing/formula.py (router/pricing/routes.py; the cost table,
router/pricing/cost_table.py, evaluates the same terms over columns of these rows)."""

from __future__ import annotations

import dataclasses
import math

import cython

from router.pricing.corrections import size_bucket
from runtime.directory.records import WorkerRecord

if cython.compiled:  # the terms as C calls (router/pricing/formula.pxd)
    from cython.cimports.router.pricing.formula import (
        interleaved_ms,
        overlap_ms,
        prefill_ms,
        queued_prefill_ms,
        tpot_ms,
    )
else:
    from router.pricing.formula import interleaved_ms, overlap_ms, prefill_ms, queued_prefill_ms, tpot_ms


@dataclasses.dataclass(slots=True)
class WorkerCosts:
    """One worker's corrected coefficients and its load-dependent terms."""

    worker: WorkerRecord
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

    def with_streams(self, live: int, planned: int, next_start_ms: float) -> WorkerCosts:
        """This row with this router's streams at the worker folded in (`CostModel.costs`):
        a copy, the load-dependent terms not computed again."""
        c = object.__new__(WorkerCosts)
        for name in _FIELDS:  # copy.copy's generic path cost more than building the row
            setattr(c, name, getattr(self, name))
        c.live, c.planned, c.next_start_ms = live, planned, next_start_ms
        return c

    def overlap_ms(self, prefill_ms: float, end_ms: float) -> float:
        """How much of a prefill of `prefill_ms` ending `end_ms` from now runs while a
        stream here decodes (formula.overlap_ms over this worker's streams)."""
        return overlap_ms(self.live, self.planned, self.next_start_ms, prefill_ms, end_ms)

    def prefill_scale(self, new: int) -> float:
        """The size correction of a prefill of `new` tokens, relative to the overall one in pre_*."""
        return self.pre_scale[size_bucket(new)] if self.pre_scale else 1.0

    def prefill_ms(self, new: int, reused: int) -> float:
        """Forward pass over `new` prompt tokens after `reused` cached ones (formula.prefill_ms)."""
        return prefill_ms(self.pre_base, self.pre_tok, self.pre_pair, new, reused,
                          self.prefill_scale(new) if self.pre_scale else 1.0)  # no call without sized corrections

    def queued_prefill_ms(self, new: int, reused: int) -> float:
        """The P side's pruning key: queue + the prefill without its size scale (formula.queued_prefill_ms)."""
        return queued_prefill_ms(self.queue_ms, self.pre_base, self.pre_tok, self.pre_pair, new, reused)

    def interleaved_ms(self, own_ms: float, new: int) -> float:
        """A prefill of `new` tokens that takes `own_ms` alone, with one decode step of this
        worker's batch between its chunks (the engine loop's chunked prefill; 0 when idle)."""
        return interleaved_ms(own_ms, new, self.chunk_tokens, self.step_ms)

    def prefill_linear_ms(self, tokens: int) -> float:
        """Queued prompt work of unknown shape: base + per-token cost (no pair term)."""
        return self.pre_base + self.pre_tok * tokens if tokens > 0 else 0.0

    def decode_step_ms(self, batch: int, context: int) -> float:
        """One decode step over `batch` sequences attending over `context` tokens in total."""
        return self.dec_base + self.dec_seq * batch + self.dec_ctx * context

    def tpot_with(self, prompt_tokens: int, max_tokens: int, extra_prefill_ms: float = 0.0) -> float:
        """Cadence of this worker's streams with one more request of this shape:
        a step over batch + 1 (rotated when over max_batch), plus the prefill work
        queued here (and `extra_prefill_ms`) spread over the request's tokens (formula.tpot_ms)."""
        return tpot_ms(self.tpot_base, self.tpot_per_token, prompt_tokens + max_tokens // 2,
                       self.queue_ms + extra_prefill_ms, max(1, max_tokens - 1))


_FIELDS = tuple(f.name for f in dataclasses.fields(WorkerCosts))
