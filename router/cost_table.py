"""Per-snapshot columns of the cost rows, and the per-request pruning over them.

A snapshot's cost rows (router/cost_model.py) change when a heartbeat, an
overlay change or a correction arrives; requests arrive far more often. So
`CostTable` lays out, once per snapshot, every row-only term of the pruning
keys as plain float lists (no attribute lookups, no tuples per request), and
`CostTable.select` evaluates one request's keys over them:

  - a worker the prefix index does not name has the same compute set as every
    other such worker, so its keys are one list comprehension over columns;
  - the few workers the index names (`req.hits`) are then patched one by one;
  - each top-k is a stable `sorted` of positions keyed by the value list, cut
    to k (what `heapq.nsmallest` returns, without its Python-level loop).

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

import math
from bisect import insort
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from router.cost_model import CostModel, WorkerCosts
from router.types import Route

if TYPE_CHECKING:
    from router.decision import RequestShape

_CACHE_SIZE = 4
"""Tables kept by rows identity (plan() may decide twice on one snapshot: avoid, then fit)."""


class CostTable:
    """Columns of one snapshot's cost rows: prefill-capable (P) and decode-capable (D) sides."""

    _cache: dict[tuple[int, ...], CostTable] = {}

    def __init__(self, rows: Sequence[WorkerCosts], early_exit: bool = True):
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
        self.d_prefill = [r.prefill_ms for r in d]  # a method: corrections (per-size scales) stay its business
        self.d_chunk, self.d_step = [r.chunk_tokens for r in d], [r.step_ms for r in d]
        self.d_busy = [r.busy for r in d]
        self.d_ids = [r.worker.worker_id for r in d]
        self.d_abi = [r.worker.cache_abi_digest for r in d]
        # Early exit (see `_select_bounded`): orders by each key's largest row-only
        # term, and the smallest of the other terms, valid when every term is >= 0.
        self.p_by_qb = sorted(range(len(self.p_rows)), key=self.p_qb.__getitem__)
        self.d_by_tpb = sorted(range(len(d)), key=self.d_tpb.__getitem__)
        self.d_by_adm = sorted(range(len(d)), key=self.d_adm.__getitem__)
        self.d_by_queue = sorted(range(len(d)), key=self.d_queue.__getitem__)
        self.p_tok_min, self.p_pair_min = min(self.p_tok, default=0.0), min(self.p_pair, default=0.0)
        self.d_tpt_min, self.d_queue_min = min(self.d_tpt, default=0.0), min(self.d_queue, default=0.0)
        self.d_kvb_min = min(self.d_kvb, default=0)
        terms = (self.p_qb, self.p_tok, self.p_pair, self.d_tpb, self.d_tpt, self.d_queue, self.d_adm, self.d_kvb,
                 self.d_step, [r.pre_base for r in d], [r.pre_tok for r in d], [r.pre_pair for r in d])
        self.bounded = early_exit and all(0 <= x < math.inf for col in terms for x in col)

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
        if self.bounded and n >= 0 and m >= 0 and ub >= 0 and k > 0:
            out = self._select_bounded(model, req, k, dict(hits), usable, split, colocated)
            if out is not None:
                return out
        if usable is None:
            p_idx, d_idx = range(len(self.p_rows)), range(len(self.d_rows))
        else:
            p_idx = [i for i, r in enumerate(self.p_rows) if usable(r)]
            d_idx = [i for i, r in enumerate(self.d_rows) if usable(r)]
        if not d_idx:
            return [], []
        tp = [b + t * ctx + q / gaps for b, t, q in zip(self.d_tpb, self.d_tpt, self.d_queue)]
        p_ms: list[float] = []
        if split and p_idx:
            new = n - h0 * bs
            c = n - new / 2.0
            p_ms = [a + t * new + p * new * c for a, t, p in zip(self.p_qb, self.p_tok, self.p_pair)]
            for wid, hit in hits:
                for i in self.p_at.get(wid, ()):
                    r, new = self.p_rows[i], n - hit * bs
                    p_ms[i] = r.queue_ms + r.pre_base + r.pre_tok * new + r.pre_pair * new * (n - new / 2.0)
        ttft_ref = req.slo_ttft_ms or max(1.0, min(p_ms[i] for i in p_idx) if p_ms else 1.0)
        tpot_ref = req.slo_tpot_ms or max(1e-3, min(tp[i] for i in d_idx))
        pairs = self._pairs(model, req, k, hits, h0, p_ms, p_idx, tp, d_idx, ttft_ref, tpot_ref) if p_ms else []
        cols = self._colocated(model, req, k, hits, h0, tp, d_idx, ttft_ref, tpot_ref) if colocated else []
        return pairs, cols

    def _select_bounded(self, model, req, k, hits, usable, split, colocated):
        """`select` visiting workers in per-snapshot order until a lower bound shows
        no later one can enter the top k. Each bound is the exact key's expression
        with a per-worker term replaced by the column's minimum (or dropped, when
        >= 0): rounding is monotone, so the bound is <= the key in floats too.
        Workers the prefix index names are priced first (their hit can beat any bound)."""
        n, m, bs = req.prompt_tokens, req.max_tokens, req.block_size
        gaps, ctx = max(1, m - 1), n + m // 2
        ok = (lambda i, rows: True) if usable is None else (lambda i, rows: usable(rows[i]))
        p_hit = {i: h for w, h in hits.items() for i in self.p_at.get(w, ())}
        d_hit = {i: h for w, h in hits.items() for i in self.d_at.get(w, ())}
        d_rows, d_tpb, d_tpt, d_queue = self.d_rows, self.d_tpb, self.d_tpt, self.d_queue
        tp_cache: dict[int, float] = {}

        def tp(i: int) -> float:
            v = tp_cache.get(i)
            if v is None:
                v = tp_cache[i] = d_tpb[i] + d_tpt[i] * ctx + d_queue[i] / gaps
            return v

        # D by TPOT (its top k and, without a target, the reference TPOT).
        lb_add = self.d_tpt_min * ctx
        q_min = self.d_queue_min / gaps
        by_tp: list[tuple[float, int]] = []
        for i in self.d_by_tpb:
            if len(by_tp) >= k and d_tpb[i] + lb_add + q_min > by_tp[k - 1][0]:
                break
            if ok(i, d_rows):
                insort(by_tp, (tp(i), i))
        if not by_tp:
            return [], []
        # P by queue + prefill of its compute set.
        by_p: list[tuple[float, int]] = []
        if split and self.p_rows:
            qb, tok, pair = self.p_qb, self.p_tok, self.p_pair
            by_p = sorted((qb[i] + tok[i] * (new := n - h * bs) + pair[i] * new * (n - new / 2.0), i)
                          for i, h in p_hit.items() if ok(i, self.p_rows))
            c = n - n / 2.0
            t_min, pr_min = self.p_tok_min * n, self.p_pair_min * n * c
            for i in self.p_by_qb:
                if len(by_p) >= k and qb[i] + t_min + pr_min > by_p[k - 1][0]:
                    break
                if i not in p_hit and ok(i, self.p_rows):
                    insort(by_p, (qb[i] + tok[i] * n + pair[i] * n * c, i))
        ttft_ref = req.slo_ttft_ms or max(1.0, by_p[0][0] if by_p else 1.0)
        tpot_ref = req.slo_tpot_ms or max(1e-3, by_tp[0][0])
        pairs = self._pairs_bounded(model, req, k, d_hit, ok, by_p, by_tp, tp, ttft_ref, tpot_ref) if by_p else []
        cols = self._colocated_bounded(model, req, k, d_hit, usable, tp, ttft_ref, tpot_ref) if colocated else []
        return None if cols is None else (pairs, cols)  # None: a negative prefill price, no bound holds

    def _pairs_bounded(self, model, req, k, d_hit, ok, by_p, by_tp, tp, ttft_ref, tpot_ref):
        ms_per_byte = model.transfer_ms("", "", 1 << 20) / (1 << 20)  # all-paths factor: a cheap bound
        blocks = req.prompt_blocks
        adm, kvb = self.d_adm, self.d_kvb

        def d_ms(i: int) -> float:
            return adm[i] + (blocks - d_hit.get(i, 0)) * kvb[i] * ms_per_byte

        by_d = sorted((d_ms(i), i) for i in d_hit if ok(i, self.d_rows))
        lb_add = blocks * self.d_kvb_min * ms_per_byte
        for i in self.d_by_adm:
            if len(by_d) >= k and adm[i] + lb_add > by_d[k - 1][0]:
                break
            if i not in d_hit and ok(i, self.d_rows):
                insort(by_d, (d_ms(i), i))
        top_d = {id(self.d_rows[i]): i for _, i in by_d[:k] + by_tp[:k]}.values()
        overhead = model.overhead_ms(Route.DISAGGREGATED)
        d_ids, d_abi = self.d_ids, self.d_abi  # pair key: _key(P + D + overhead, TPOT), per pair as the reference
        top_d = [(j, d_ids[j], d_abi[j], d_ms(j), tp(j) / tpot_ref) for j in top_d]
        keyed = []
        for pm, i in by_p[:k]:
            pid, abi = self.p_ids[i], self.p_abi[i]
            for j, did, dabi, dm, tpot in top_d:
                if did != pid and dabi == abi:
                    keyed.append(((pm + dm + overhead) / ttft_ref + tpot, i, j))
        return [(self.p_rows[i], self.d_rows[j]) for _, i, j in sorted(keyed, key=_first)[:k]]

    def _colocated_bounded(self, model, req, k, d_hit, usable, tp, ttft_ref, tpot_ref):
        """Two sorted lists (queue, TPOT base), walked together (Fagin's threshold
        algorithm): a worker not yet seen at depth t has a queue and a TPOT base at
        least those at depth t of each list, so the key's bound there bounds it."""
        n, bs, m = req.prompt_tokens, req.block_size, req.max_tokens
        gaps, ctx = max(1, m - 1), n + m // 2
        overhead = model.overhead_ms(Route.COLOCATED)
        rows, queue, tpb = self.d_rows, self.d_queue, self.d_tpb
        tpt_add = self.d_tpt_min * ctx
        seen = bytearray(len(rows))
        best: list[tuple[float, int]] = []

        def visit(i: int) -> bool:
            seen[i] = 1
            r = rows[i]
            if usable is not None and not usable(r):
                return True
            reused = d_hit.get(i, 0) * bs
            own = r.prefill_ms(n - reused, reused)
            ttft = r.queue_ms + own + -(-(n - reused) // r.chunk_tokens) * r.step_ms + overhead
            insort(best, (ttft / ttft_ref + (tp(i) + (own / gaps if r.busy else 0.0)) / tpot_ref, i))
            return own >= 0

        if not all([visit(i) for i in d_hit]):
            return None
        for qi, ti in zip(self.d_by_queue, self.d_by_tpb):
            if not ((seen[qi] or visit(qi)) and (seen[ti] or visit(ti))):
                return None
            q = queue[qi]
            if len(best) >= k and best[k - 1][0] < (q + overhead) / ttft_ref + (tpb[ti] + tpt_add + q / gaps) / tpot_ref:
                break
        return [rows[i] for _, i in best[:k]]

    def _pairs(self, model, req, k, hits, h0, p_ms, p_idx, tp, d_idx, ttft_ref, tpot_ref):
        ms_per_byte = model.transfer_ms("", "", 1 << 20) / (1 << 20)  # all-paths factor: a cheap bound
        blocks = req.prompt_blocks
        moved = blocks - h0
        d_ms = [a + moved * kv * ms_per_byte for a, kv in zip(self.d_adm, self.d_kvb)]
        for wid, hit in hits:
            for i in self.d_at.get(wid, ()):
                r = self.d_rows[i]
                d_ms[i] = r.admission_ms + (blocks - hit) * r.kv_bytes_per_block * ms_per_byte
        top_d = {id(self.d_rows[i]): i for i in sorted(d_idx, key=d_ms.__getitem__)[:k]
                 + sorted(d_idx, key=tp.__getitem__)[:k]}.values()
        overhead = model.overhead_ms(Route.DISAGGREGATED)
        d_ids, d_abi = self.d_ids, self.d_abi
        keyed = []
        for i in sorted(p_idx, key=p_ms.__getitem__)[:k]:
            pid, abi, pm = self.p_ids[i], self.p_abi[i], p_ms[i]
            for j in top_d:
                if d_ids[j] != pid and d_abi[j] == abi:
                    keyed.append(((pm + d_ms[j] + overhead) / ttft_ref + tp[j] / tpot_ref, i, j))
        return [(self.p_rows[i], self.d_rows[j]) for _, i, j in sorted(keyed, key=_first)[:k]]

    def _colocated(self, model, req, k, hits, h0, tp, d_idx, ttft_ref, tpot_ref):
        n, bs, gaps = req.prompt_tokens, req.block_size, max(1, req.max_tokens - 1)
        overhead = model.overhead_ms(Route.COLOCATED)
        reused = h0 * bs
        new = n - reused
        own = [f(new, reused) for f in self.d_prefill]
        ttft = [q + o + -(-new // ch) * st + overhead
                for q, o, ch, st in zip(self.d_queue, own, self.d_chunk, self.d_step)]
        for wid, hit in hits:
            for i in self.d_at.get(wid, ()):
                r, reused = self.d_rows[i], hit * bs
                own[i] = o = r.prefill_ms(n - reused, reused)
                ttft[i] = r.queue_ms + o + -(-(n - reused) // r.chunk_tokens) * r.step_ms + overhead
        key = [t / ttft_ref + (s + (o / gaps if busy else 0.0)) / tpot_ref
               for t, s, o, busy in zip(ttft, tp, own, self.d_busy)]
        return [self.d_rows[i] for i in sorted(d_idx, key=key.__getitem__)[:k]]


def _positions(rows: list[WorkerCosts]) -> dict[str, tuple[int, ...]]:
    at: dict[str, tuple[int, ...]] = {}
    for i, r in enumerate(rows):
        at[r.worker.worker_id] = at.get(r.worker.worker_id, ()) + (i,)
    return at


def _first(x: tuple) -> float:
    return x[0]
