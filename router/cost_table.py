"""Per-snapshot columns of the cost rows, and the per-request pruning over them.

A snapshot's cost rows (router/cost_model.py) change when a heartbeat, an
overlay change or a correction arrives; requests arrive far more often. So
`CostTable` lays out, once per snapshot, every row-only term of the pruning
keys as plain float lists (no attribute lookups, no tuples per request), and
`CostTable.select` evaluates one request's keys over them:

  - a worker the prefix index does not name has the same compute set as every
    other such worker, so each key is one list comprehension over columns
    (the colocated key in one pass, its prefill inlined);
  - the few workers the index names (`req.hits`) are then patched one by one;
  - each top-k is a stable `sorted` of positions keyed by the value list, cut
    to k (what `heapq.nsmallest` returns, without its Python-level loop).

At 64-256 workers a full pass of comprehensions costs less than ordered scans
with a lower-bound early exit (tried: the colocated bound is loose, most
workers were visited anyway, one Python call each).

Must match `reference_candidates` in router/decision.py: the same keys computed
with the same operations in the same order (so the same floats; the terms
folded into columns are ones the reference adds first, left to right), and the
same tie order (both keep rows order on ties).
tests/unit/test_router_decision_table.py checks both on random snapshots.

Safety invariant: cost rows are never mutated after CostModel builds them (a
new load or correction builds new rows), so a table cached by the identity of
its rows stays valid while it holds them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from router.cost_model import SIZE_BUCKETS, CostModel, WorkerCosts
from router.types import Route

if TYPE_CHECKING:
    from router.decision import RequestShape

_CACHE_SIZE = 4
"""Tables kept by rows identity (plan() may decide twice on one snapshot: avoid, then fit)."""


class CostTable:
    """Columns of one snapshot's cost rows: prefill-capable (P) and decode-capable (D) sides."""

    _cache: dict[tuple[int, ...], CostTable] = {}

    def __init__(self, rows: Sequence[WorkerCosts]):
        self.rows = tuple(rows)
        self.p_rows = [r for r in self.rows if r.can_prefill]
        self.d_rows = [r for r in self.rows if r.can_decode]
        self.p_at = _positions(self.p_rows)
        self.d_at = _positions(self.d_rows)
        # P: queue + prefill base (the reference adds these first), per-token and pair slopes.
        self.p_qb = [r.queue_ms + r.pre_base for r in self.p_rows]
        self.p_tok = [r.pre_tok for r in self.p_rows]
        self.p_pair = [r.pre_pair for r in self.p_rows]
        self.p_ids = [r.worker.worker_id for r in self.p_rows]
        self.p_abi = [r.worker.cache_abi_digest for r in self.p_rows]
        d = self.d_rows
        self.d_tpb, self.d_tpt = [r.tpot_base for r in d], [r.tpot_per_token for r in d]
        self.d_queue, self.d_adm = [r.queue_ms for r in d], [r.admission_ms for r in d]
        self.d_kvb = [r.kv_bytes_per_block for r in d]
        self.d_pb, self.d_pt, self.d_pp = [r.pre_base for r in d], [r.pre_tok for r in d], [r.pre_pair for r in d]
        self._d_scale: dict[int, list[float]] = {}  # size bucket -> each D row's prefill scale there (lazily)
        self.d_chunk, self.d_step = [r.chunk_tokens for r in d], [r.step_ms for r in d]
        self.d_busy = [r.busy for r in d]
        self.d_ids = [r.worker.worker_id for r in d]
        self.d_abi = [r.worker.cache_abi_digest for r in d]

    @classmethod
    def of(cls, rows: Sequence[WorkerCosts]) -> CostTable:
        """The table of `rows`, built once per distinct list of row objects."""
        if isinstance(rows, CostTable):
            return rows
        key = tuple(map(id, rows))
        table = cls._cache.get(key)
        if table is None:
            if len(cls._cache) >= _CACHE_SIZE:
                del cls._cache[next(iter(cls._cache))]
            table = cls._cache[key] = cls(rows)
        return table

    def select(self, model: CostModel, req: RequestShape, top_k: int,
               usable: Callable[[WorkerCosts], bool] | None = None, split: bool = True, colocated: bool = True,
               ) -> tuple[list[tuple[WorkerCosts, WorkerCosts]], list[WorkerCosts]]:
        """The pairs (P, D) and colocated workers `reference_candidates` would price, in its order."""
        k = max(0, top_k)
        n, m, bs, ub = req.prompt_tokens, req.max_tokens, req.block_size, req.usable_blocks
        gaps, ctx = max(1, m - 1), n + m // 2
        h0 = 0 if ub >= 0 else ub  # the hit of a worker the index does not name
        hits = [(w, h if h < ub else ub) for w, h in req.hits.items()] if req.hits else []
        if usable is None:
            p_idx, d_idx = range(len(self.p_rows)), range(len(self.d_rows))
        else:
            p_idx = [i for i, r in enumerate(self.p_rows) if usable(r)]
            d_idx = [i for i, r in enumerate(self.d_rows) if usable(r)]
        if not d_idx:
            return [], []
        # D: TPOT with this request (WorkerCosts.tpot_with, no extra prefill).
        tp = [b + t * ctx + q / gaps for b, t, q in zip(self.d_tpb, self.d_tpt, self.d_queue)]
        p_ms: list[float] = []
        if split and p_idx:  # P: queue + prefill of its compute set
            new = n - h0 * bs
            c = n - new / 2.0
            p_ms = [a + t * new + p * new * c for a, t, p in zip(self.p_qb, self.p_tok, self.p_pair)]
            for wid, hit in hits:
                for i in self.p_at.get(wid, ()):
                    r, new = self.p_rows[i], n - hit * bs
                    p_ms[i] = r.queue_ms + r.pre_base + r.pre_tok * new + r.pre_pair * new * (n - new / 2.0)
        full = usable is None
        ttft_ref = req.slo_ttft_ms or max(1.0, (min(p_ms) if full else min(p_ms[i] for i in p_idx)) if p_ms else 1.0)
        tpot_ref = req.slo_tpot_ms or max(1e-3, min(tp) if full else min(tp[i] for i in d_idx))
        pairs = self._pairs(model, req, k, hits, h0, p_ms, p_idx, tp, d_idx, ttft_ref, tpot_ref) if p_ms else []
        cols = self._colocated(model, req, k, hits, h0, tp, d_idx, ttft_ref, tpot_ref) if colocated else []
        return pairs, cols

    def _pairs(self, model, req, k, hits, h0, p_ms, p_idx, tp, d_idx, ttft_ref, tpot_ref):
        """The k best pairs among the k best P by p_ms and the k best D by each of d_ms and TPOT."""
        ms_per_byte = model.transfer_ms("", "", 1 << 20) / (1 << 20)  # all-paths factor: a cheap bound
        blocks = req.prompt_blocks
        moved = blocks - h0
        d_ms = [a + moved * kv * ms_per_byte for a, kv in zip(self.d_adm, self.d_kvb)]
        for wid, hit in hits:
            for i in self.d_at.get(wid, ()):
                r = self.d_rows[i]
                d_ms[i] = r.admission_ms + (blocks - hit) * r.kv_bytes_per_block * ms_per_byte
        d_rows, d_ids, d_abi = self.d_rows, self.d_ids, self.d_abi
        top_d = {id(d_rows[j]): j for j in sorted(d_idx, key=d_ms.__getitem__)[:k]
                 + sorted(d_idx, key=tp.__getitem__)[:k]}.values()
        top_d = [(j, d_ids[j], d_abi[j], d_ms[j], tp[j] / tpot_ref) for j in top_d]
        overhead = model.overhead_ms(Route.DISAGGREGATED)
        p_ids, p_abi = self.p_ids, self.p_abi
        keyed = [((p_ms[i] + dm + overhead) / ttft_ref + tpot, i, j)
                 for i in sorted(p_idx, key=p_ms.__getitem__)[:k]
                 for j, did, dabi, dm, tpot in top_d if did != p_ids[i] and dabi == p_abi[i]]
        keyed.sort(key=_first)
        return [(self.p_rows[i], d_rows[j]) for _, i, j in keyed[:k]]

    def _colocated(self, model, req, k, hits, h0, tp, d_idx, ttft_ref, tpot_ref):
        """The k best colocated workers by TTFT and TPOT (with W's own prefill when busy), relative."""
        n, bs, gaps = req.prompt_tokens, req.block_size, max(1, req.max_tokens - 1)
        overhead = model.overhead_ms(Route.COLOCATED)
        reused = h0 * bs
        new = n - reused
        if new > 0:  # WorkerCosts.prefill_ms inlined as `o` (see _d_prefill)
            c = reused + new / 2.0
            key = [(q + (o := (b + t * new + p * new * c) * f) + -(-new // ch) * st + overhead) / ttft_ref
                   + (s + (o / gaps if busy else 0.0)) / tpot_ref
                   for q, b, t, p, f, ch, st, s, busy in zip(
                       self.d_queue, self.d_pb, self.d_pt, self.d_pp, self._d_scale_at(new), self.d_chunk,
                       self.d_step, tp, self.d_busy)]
        else:
            key = [(q + 0.0 + -(-new // ch) * st + overhead) / ttft_ref + (s + 0.0) / tpot_ref
                   for q, ch, st, s in zip(self.d_queue, self.d_chunk, self.d_step, tp)]
        for wid, hit in hits:
            for i in self.d_at.get(wid, ()):
                r, reused = self.d_rows[i], hit * bs
                o = r.prefill_ms(n - reused, reused)
                ttft = r.queue_ms + o + -(-(n - reused) // r.chunk_tokens) * r.step_ms + overhead
                key[i] = ttft / ttft_ref + (tp[i] + (o / gaps if r.busy else 0.0)) / tpot_ref
        return [self.d_rows[i] for i in sorted(d_idx, key=key.__getitem__)[:k]]

    def _d_scale_at(self, new: int) -> list[float]:
        """Each D row's prefill scale for `new` tokens: WorkerCosts.prefill_ms is
        (pre_base + pre_tok * new + pre_pair * new * (reused + new / 2.0)) * scale,
        with scale 1.0 without sized corrections. Must match WorkerCosts.prefill_ms
        in router/cost_model.py (same operations, same order: the same floats)."""
        bucket = min(new.bit_length(), SIZE_BUCKETS - 1)
        scale = self._d_scale.get(bucket)
        if scale is None:
            scale = self._d_scale[bucket] = [r.pre_scale[bucket] if r.pre_scale else 1.0 for r in self.d_rows]
        return scale


def _positions(rows: list[WorkerCosts]) -> dict[str, tuple[int, ...]]:
    at: dict[str, tuple[int, ...]] = {}
    for i, r in enumerate(rows):
        at[r.worker.worker_id] = at.get(r.worker.worker_id, ()) + (i,)
    return at


def _first(x: tuple) -> float:
    return x[0]
