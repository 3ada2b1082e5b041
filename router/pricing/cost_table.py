"""Per-snapshot columns of the cost rows, and the per-request pruning over them.

A snapshot's cost rows (router/pricing/cost_model.py) change when a heartbeat, an
overlay change or a correction arrives; requests arrive far more often. So
`CostTable` lays out, once per snapshot, every row-only term of the pruning
keys as plain float lists (no attribute lookups, no tuples per request), and
`CostTable.price` evaluates one request's keys over them:

  - a worker the prefix index does not name has the same compute set as every
    other such worker, so each key is one pass over the columns (the
    colocated key in one pass, its prefill inlined);
  - the few workers the index names (`req.hits`) are then patched one by one;
  - each top-k is the k smallest positions in (value, position) order (what
    `heapq.nsmallest` returns).

The per-row loops (the keys over every row, the top-k picks) are the typed
functions of router/pricing/table_kernel.py, over two flat `array('d')` blocks of the
float columns (`a_p`, `a_d`) and one scratch array per request holding every
key: compiled (router/native.py) they are C loops; rows filtered by `usable`
take Python's `sorted` instead.

At 64-256 workers a full pass over every row costs less than ordered scans
with a lower-bound early exit (tried: the colocated bound is loose, most
workers were visited anyway, one Python call each).

Must match `reference_candidates` in router/pricing/reference.py: the same keys computed
with the same operations in the same order (so the same floats; the terms
folded into columns are ones the reference adds first, left to right), and the
same tie order (both keep rows order on ties).
tests/unit/router/pricing/test_decision_table.py checks both on random snapshots.

Safety invariant: cost rows are never mutated after CostModel builds them (a
new load or correction builds new rows), so a table cached by the identity of
its rows stays valid while it holds them.
"""

from __future__ import annotations

import copy
import itertools
import operator
from array import array
from collections.abc import Callable, Sequence

from router.pricing.candidate import Row
from router.pricing.corrections import SIZE_BUCKETS
from router.pricing.cost_model import CostModel
from router.pricing.interference import colocated_disturb_ms, split_disturb_ms, stalled_streams
from router.pricing.shapes import RequestShape
from router.pricing.table_kernel import (
    COMPILED,
    D_COLUMNS,
    P_COLUMNS,
    colocated_keys,
    decode_keys,
    least,
    prefill_keys,
    smallest,
)
from router.pricing.worker_costs import WorkerCosts
from router.types import Route

_CACHE_SIZE = 4
"""Tables kept by rows identity (plan() may decide twice on one snapshot: avoid, then fit)."""
_FIRST = operator.itemgetter(0)


_P_COLUMNS: dict[str, Callable[[WorkerCosts], object]] = {
    "p_qb": lambda r: r.queue_ms + r.pre_base,  # queue + prefill base: the reference adds these first
    "p_tok": operator.attrgetter("pre_tok"),
    "p_pair": operator.attrgetter("pre_pair"),
    "p_ids": lambda r: r.worker.worker_id,
    "p_abi": lambda r: r.worker.cache_abi_digest,
    "p_kvb": operator.attrgetter("kv_bytes_per_block"),
}
"""Per-row columns of the prefill-capable side (CostTable attributes)."""

_D_COLUMNS: dict[str, Callable[[WorkerCosts], object]] = {
    "d_tpb": operator.attrgetter("tpot_base"),
    "d_tpt": operator.attrgetter("tpot_per_token"),
    "d_queue": operator.attrgetter("queue_ms"),
    "d_adm": operator.attrgetter("admission_ms"),
    "d_kvb": operator.attrgetter("kv_bytes_per_block"),
    "d_pb": operator.attrgetter("pre_base"),
    "d_pt": operator.attrgetter("pre_tok"),
    "d_pp": operator.attrgetter("pre_pair"),
    "d_chunk": operator.attrgetter("chunk_tokens"),
    "d_step": operator.attrgetter("step_ms"),
    "d_live": lambda r: r.live > 0,
    "d_ids": lambda r: r.worker.worker_id,
    "d_abi": lambda r: r.worker.cache_abi_digest,
    "d_free": operator.attrgetter("free_blocks"),
    "d_total": lambda r: r.worker.capacity.total_blocks,
    "d_streams": lambda r: r.live + r.planned,
}
"""Per-row columns of the decode-capable side (CostTable attributes)."""


class CostTable:
    """Columns of one snapshot's cost rows: prefill-capable (P) and decode-capable (D) sides."""

    _cache: dict[tuple[int, ...], CostTable] = {}
    _last: CostTable | None = None

    def __init__(self, rows: Sequence[WorkerCosts]):
        self.rows = tuple(rows)
        self.p_rows = [r for r in self.rows if r.can_prefill]
        self.d_rows = [r for r in self.rows if r.can_decode]
        self.p_at = _positions(self.p_rows)
        self.d_at = _positions(self.d_rows)
        self._p_of = list(itertools.accumulate((r.can_prefill for r in self.rows), initial=0))
        self._d_of = list(itertools.accumulate((r.can_decode for r in self.rows), initial=0))
        """Row i's position on each side: _p_of[i], when rows[i] can prefill (a running count)."""
        for name, get in _P_COLUMNS.items():
            setattr(self, name, list(map(get, self.p_rows)))
        for name, get in _D_COLUMNS.items():
            setattr(self, name, list(map(get, self.d_rows)))
        self._d_scale: dict[int, array] = {}  # size bucket -> each D row's prefill scale there (lazily)
        self.d_simple = _simple(self)
        """No D row has sized prefill corrections: the colocated key's scale is 1.0."""
        self.d_timed = _timed(self)
        _set_arrays(self)

    @classmethod
    def of(cls, rows: Sequence[WorkerCosts]) -> CostTable:
        """The table of `rows`, built once per distinct list of row objects (or patched
        from the previous one when only a few rows differ: this router's overlay)."""
        if isinstance(rows, CostTable):
            return rows
        last = cls._last
        if last is not None and len(rows) == len(last.rows) and all(map(operator.is_, rows, last.rows)):
            return last  # the common case: the same snapshot as the previous request (no hashing)
        key = tuple(map(id, rows))
        table = cls._cache.get(key)
        if table is None:
            if len(cls._cache) >= _CACHE_SIZE:
                del cls._cache[next(iter(cls._cache))]
            table = (last.patched(rows) if last is not None else None) or cls(rows)
            cls._cache[key] = table
        cls._last = table
        return table

    def patched(self, rows: Sequence[WorkerCosts]) -> CostTable | None:
        """The table of `rows` made from this one by replacing the few rows that differ,
        or None when too many differ or one changed its worker id or roles (then build
        anew). Equal to CostTable(rows) (tests/unit/router/pricing/test_decision_table.py)."""
        if len(rows) != len(self.rows):
            return None
        changed = [i for i, (a, b) in enumerate(zip(rows, self.rows)) if a is not b]
        if len(changed) > max(4, len(rows) // 8):
            return None
        for i in changed:
            r, old = rows[i], self.rows[i]
            if (r.worker.worker_id, r.can_prefill, r.can_decode) != (old.worker.worker_id, old.can_prefill,
                                                                       old.can_decode):
                return None
        new = copy.copy(self)  # p_at, d_at, _p_of, _d_of stay shared: ids and roles are unchanged
        new.rows, new.p_rows, new.d_rows, new._d_scale = tuple(rows), list(self.p_rows), list(self.d_rows), {}
        for name in itertools.chain(_P_COLUMNS, _D_COLUMNS):
            setattr(new, name, list(getattr(self, name)))
        for i in changed:
            r = rows[i]
            if r.can_prefill:
                j = self._p_of[i]
                new.p_rows[j] = r
                for name, get in _P_COLUMNS.items():
                    getattr(new, name)[j] = get(r)
            if r.can_decode:
                j = self._d_of[i]
                new.d_rows[j] = r
                for name, get in _D_COLUMNS.items():
                    getattr(new, name)[j] = get(r)
        new.d_simple = _simple(new)
        new.d_timed = _timed(new)
        _set_arrays(new)
        return new

    def price(self, model: CostModel, req: RequestShape, top_k: int,
              usable: Callable[[WorkerCosts], bool] | None = None, split: bool = True, colocated: bool = True,
              ) -> list[Row]:
        """What `reference_candidates` returns, as Rows (router/pricing/candidate.py): the
        pairs and colocated workers it would price, in its order, priced from the
        columns as `pair_row` and `colocated_row` in router/pricing/decision.py price them."""
        k = max(0, top_k)
        ub = req.usable_blocks
        h0 = 0 if ub >= 0 else ub  # the hit of a worker the index does not name
        p_hit: dict[int, int] = {}  # position -> usable hit blocks, for the workers the index names
        d_hit: dict[int, int] = {}
        for w, h in req.hits.items():
            h = h if h < ub else ub
            for i in self.p_at.get(w, ()):
                p_hit[i] = h
            for i in self.d_at.get(w, ()):
                d_hit[i] = h
        if usable is None:
            p_idx, d_idx = range(len(self.p_rows)), range(len(self.d_rows))
        else:
            p_idx = [i for i, r in enumerate(self.p_rows) if usable(r)]
            d_idx = [i for i, r in enumerate(self.d_rows) if usable(r)]
        if not d_idx:
            return []
        q = _Request(req, h0, p_hit, d_hit)
        n, bs, blocks = q.n, q.bs, q.blocks
        np_, nd = len(self.p_rows), len(self.d_rows)
        tp_at, dms_at, key_at = self.tp_at, self.dms_at, self.key_at
        s = self._scratch[:]
        split = bool(split and p_idx)
        if split:  # P: queue + prefill of its compute set
            new = n - h0 * bs
            prefill_keys(self.a_p, np_, new, n - new / 2.0, s)
            for i, hit in p_hit.items():
                r, new = self.p_rows[i], n - hit * bs
                s[i] = r.queue_ms + r.pre_base + r.pre_tok * new + r.pre_pair * new * (n - new / 2.0)
        # D: TPOT with this request (WorkerCosts.tpot_with, no extra prefill) and, for
        # splits, admission + the cheap transfer bound at the all-paths factor.
        ms_per_byte = model.transfer_ms("", "", 1 << 20) / (1 << 20) if split else 0.0
        decode_keys(self.a_d, nd, q.ctx, q.gaps, blocks - h0, ms_per_byte, split, s, tp_at)
        if split:
            for i, hit in d_hit.items():
                r = self.d_rows[i]
                s[dms_at + i] = r.admission_ms + (blocks - hit) * r.kv_bytes_per_block * ms_per_byte
        full = usable is None
        ttft_ref = req.slo_ttft_ms or max(1.0, (least(s, 0, np_) if full else min(s[i] for i in p_idx))
                                          if split else 1.0)
        tpot_ref = req.slo_tpot_ms or max(1e-3, least(s, tp_at, nd) if full else min(s[tp_at + i] for i in d_idx))
        if colocated:
            col_overhead = model.overhead_ms(Route.COLOCATED)
            self._colocated_keys(q, s, col_overhead, ttft_ref, tpot_ref)
        spans, among = [], []
        if split:
            spans += [(0, np_), (dms_at, nd), (tp_at, nd)]
            among += [p_idx, d_idx, d_idx]
        if colocated:
            spans.append((key_at, nd))
            among.append(d_idx)
        picks = _tops(s, spans, among, k, full)
        out = self._pairs(model, q, k, s, picks[0], picks[1] + picks[2], ttft_ref, tpot_ref) if split else []
        if colocated:
            out += self._colocated(q, s, picks[-1], col_overhead)
        return out

    def _pairs(self, model, q, k, s, top_p, top_d, ttft_ref, tpot_ref):
        """The k best pairs among the k best P by p_ms (`top_p`) and the k best D by each
        of d_ms and TPOT (`top_d`, both lists), priced."""
        tp_at, dms_at = self.tp_at, self.dms_at
        d_rows, d_ids, d_abi = self.d_rows, self.d_ids, self.d_abi
        top_d = {id(d_rows[j]): j for j in top_d}.values()
        top_d = [(j, d_ids[j], d_abi[j], s[dms_at + j], s[tp_at + j] / tpot_ref) for j in top_d]
        overhead = model.overhead_ms(Route.DISAGGREGATED)
        p_ids, p_abi = self.p_ids, self.p_abi
        top_p = [(i, p_ids[i], p_abi[i], s[i]) for i in top_p]
        keyed = [((pm + dm + overhead) / ttft_ref + tpot, i, j)
                 for i, pid, pabi, pm in top_p
                 for j, did, dabi, dm, tpot in top_d if did != pid and dabi == pabi]
        keyed.sort(key=_FIRST)
        # Priced as decision.pair_row prices them; D's TPOT is tp (== WorkerCosts.tpot_with(n, m)).
        n, bs, h0, need, p_hit, d_hit, blocks = q.n, q.bs, q.h0, q.need, q.p_hit, q.d_hit, q.blocks
        p_rows, dis, transfer_ms = self.p_rows, Route.DISAGGREGATED, model.transfer_ms
        m = q.m
        # P position -> (reused, compute, prefill ms, disturb, stalled): the top pairs mostly share one P
        out, p_side = [], {}
        for _, i, j in keyed[:k]:
            p = p_rows[i]
            side = p_side.get(i)
            if side is None:
                reused = p_hit.get(i, h0) * bs
                own = p.prefill_ms(n - reused, reused)
                prefill = p.interleaved_ms(own, n - reused)
                end = p.queue_ms + prefill
                side = p_side[i] = (reused, n - reused, prefill, split_disturb_ms(p, own, m, end),
                                    stalled_streams(p, end) if p.can_decode else 0)
            reused, compute, prefill, disturb, stalled = side
            moved_blocks = blocks - d_hit.get(j, h0)
            nbytes = moved_blocks * (self.p_kvb[i] or self.d_kvb[j])
            transfer = transfer_ms(p_ids[i], d_ids[j], nbytes)
            qm, adm = p.queue_ms, self.d_adm[j]
            out.append((dis, d_rows[j].worker, p.worker, qm + prefill + transfer + adm + overhead, s[tp_at + j], qm,
                        prefill, transfer, adm, overhead, n, compute, min(n, moved_blocks * bs), nbytes,
                        p.pending_tokens, self.d_free[j] - need, self.d_total[j], disturb, stalled,
                        self.d_streams[j]))
        return out

    def _colocated_keys(self, q, s, overhead, ttft_ref, tpot_ref):
        """Each D row's colocated key, by TTFT and TPOT (with the part of W's own prefill
        that overlaps W's streams) relative to their targets, into the key segment of `s`."""
        n, bs, gaps, h0 = q.n, q.bs, q.gaps, q.h0
        nd, tp_at, key_at = len(self.d_rows), self.tp_at, self.key_at
        reused = h0 * bs
        new = n - reused
        # W's own prefill dilates W's streams: all of it on a row with live streams
        # (d_live), none on a row without any; the rows whose streams are only planned
        # (d_timed: a partial overlap) are keyed exactly below, with the prefix hits.
        if new > 0:  # WorkerCosts.prefill_ms inlined (see _d_scale_at), in router/pricing/table_kernel.py
            scaled = not self.d_simple
            colocated_keys(self.a_d, nd, self._d_scale_at(new) if scaled else self.a_d, scaled, new,
                           reused + new / 2.0, gaps, overhead, ttft_ref, tpot_ref, s, tp_at, key_at)
        else:
            for i, (qu, ch, st) in enumerate(zip(self.d_queue, self.d_chunk, self.d_step)):
                s[key_at + i] = (qu + 0.0 + -(-new // ch) * st + overhead) / ttft_ref + (s[tp_at + i] + 0.0) / tpot_ref
        d_hit = q.d_hit
        for i in self.d_timed:
            if i not in d_hit:
                s[key_at + i] = self._exact_key(i, h0, q, s[tp_at + i], overhead, ttft_ref, tpot_ref)
        for i, hit in d_hit.items():
            s[key_at + i] = self._exact_key(i, hit, q, s[tp_at + i], overhead, ttft_ref, tpot_ref)

    def _colocated(self, q, s, top, overhead):
        """The colocated workers `top` (the k best keys), priced as decision.colocated_row
        prices them, WorkerCosts.tpot_with inlined (must match it in router/pricing/cost_model.py:
        the same operations in the same order)."""
        n, bs, gaps, h0, d_hit = q.n, q.bs, q.gaps, q.h0, q.d_hit
        ctx, need, col = q.ctx, q.need, Route.COLOCATED
        out = []
        for i in top:
            w = self.d_rows[i]
            reused = d_hit.get(i, h0) * bs
            compute = n - reused
            own = w.prefill_ms(compute, reused)
            prefill = w.interleaved_ms(own, compute)
            qm = self.d_queue[i]
            end = qm + prefill
            tpot = self.d_tpb[i] + self.d_tpt[i] * ctx + (qm + w.overlap_ms(own, end)) / gaps
            out.append((col, w.worker, None, qm + prefill + overhead, tpot, qm, prefill, 0.0, 0.0, overhead, n, compute,
                        0, 0, w.pending_tokens, self.d_free[i] - need, self.d_total[i],
                        colocated_disturb_ms(w, own, q.m, end), stalled_streams(w, end), self.d_streams[i]))
        return out

    def _exact_key(self, i: int, hit: int, q: _Request, tp: float, overhead: float, ttft_ref: float,
                   tpot_ref: float) -> float:
        """D row i's colocated key with `hit` usable prefix blocks and TPOT `tp` (WorkerCosts.colocated_key,
        as reference_candidates in router/pricing/reference.py keys every row)."""
        return self.d_rows[i].colocated_key(q.n, hit * q.bs, tp, q.gaps, overhead, ttft_ref, tpot_ref)

    def _d_scale_at(self, new: int) -> array:
        """Each D row's prefill scale for `new` tokens: WorkerCosts.prefill_ms is
        (pre_base + pre_tok * new + pre_pair * new * (reused + new / 2.0)) * scale,
        with scale 1.0 without sized corrections. Must match WorkerCosts.prefill_ms
        in router/pricing/cost_model.py (same operations, same order: the same floats)."""
        bucket = min(new.bit_length(), SIZE_BUCKETS - 1)
        scale = self._d_scale.get(bucket)
        if scale is None:
            scale = self._d_scale[bucket] = array("d", [r.pre_scale[bucket] if r.pre_scale else 1.0
                                                        for r in self.d_rows])
        return scale


class _Request:
    """One request's terms the table's passes share (computed once)."""

    __slots__ = ("n", "m", "bs", "gaps", "ctx", "blocks", "need", "h0", "p_hit", "d_hit")

    def __init__(self, req: RequestShape, h0: int, p_hit: dict[int, int], d_hit: dict[int, int]):
        n, m = req.prompt_tokens, req.max_tokens
        self.n, self.m, self.bs, self.gaps, self.ctx = n, m, req.block_size, max(1, m - 1), n + m // 2
        self.blocks, self.need = req.prompt_blocks, req.need_blocks
        self.h0, self.p_hit, self.d_hit = h0, p_hit, d_hit


def _simple(t: CostTable) -> bool:
    """CostTable.d_simple."""
    return not any(r.pre_scale for r in t.d_rows)


def _set_arrays(t: CostTable) -> None:
    """The column blocks of router/pricing/table_kernel.py (`a_p`, `a_d`: its P_COLUMNS and
    D_COLUMNS, column-major, as doubles), the per-request scratch template and its segments'
    offsets: [p_ms | tp | d_ms | key] (`tp_at`, `dms_at`, `key_at`)."""
    t.a_p = array("d", itertools.chain.from_iterable(getattr(t, name) for name in P_COLUMNS))
    t.a_d = array("d", itertools.chain.from_iterable(getattr(t, name) for name in D_COLUMNS))
    np_, nd = len(t.p_rows), len(t.d_rows)
    t._scratch = array("d", bytes(8 * (np_ + 3 * nd)))
    t.tp_at, t.dms_at, t.key_at = np_, np_ + nd, np_ + 2 * nd


def _tops(s: array, spans: list[tuple[int, int]], among: list[Sequence[int]], k: int, full: bool) -> list[list[int]]:
    """Per (offset, length) span of `s`: the k positions of its `among` with the smallest
    values, ascending, ties in position order: `sorted(among, key=lambda i: s[offset + i])[:k]`;
    in router/pricing/table_kernel.py when that runs compiled and `among` is every position
    (`full`) and no value is NaN."""
    if COMPILED and full:
        top = smallest(s, spans, k)
        if top is not None:
            return top
    return [sorted(idx, key=lambda i, o=off: s[o + i])[:k] for (off, _), idx in zip(spans, among)]


def _timed(t: CostTable) -> list[int]:
    """CostTable.d_timed: D rows without live streams and with planned ones."""
    return [i for i, r in enumerate(t.d_rows) if r.live <= 0 and r.planned > 0]


def _positions(rows: list[WorkerCosts]) -> dict[str, tuple[int, ...]]:
    at: dict[str, tuple[int, ...]] = {}
    for i, r in enumerate(rows):
        at[r.worker.worker_id] = (*at.get(r.worker.worker_id, ()), i)
    return at
