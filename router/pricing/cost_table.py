"""Per-snapshot columns of the cost rows, and the per-request pruning over them.

A snapshot's cost rows (router/pricing/cost_model.py) change when a heartbeat, an
overlay change or a correction arrives; requests arrive far more often. So
`CostTable` lays out, once per snapshot, every row-only term of the pruning
keys as plain float lists (no attribute lookups, no tuples per request), and
`CostTable.price` evaluates one request's keys over them:

  - a worker the prefix index does not name has the same compute set as every
    other such worker, so each key is one pass over the columns;
  - the few workers the index names (`req.hits`) are then patched one by one;
  - each top-k is the k smallest positions in (value, position) order (what
    `heapq.nsmallest` returns).

The per-row loops (the keys over every row, the top-k picks) are the column loops of
router/pricing/formula.py, over two flat `array('d')` blocks of the float columns
(`a_p`, `a_d`) and one scratch array per request holding every key: compiled
(router/native.py) they are C loops; rows filtered by `usable` take Python's
`sorted` instead. The loops, the patches and the pricing of the survivors
(router/pricing/routes.py) all evaluate formula.py's terms, so the keys are the
doubles `reference_candidates` (router/pricing/reference.py) computes row by row,
and both keep rows order on ties; tests/unit/router/pricing/test_decision_table.py checks
the two on random snapshots.

At 64-256 workers a full pass over every row costs less than ordered scans
with a lower-bound early exit (tried: the colocated bound is loose, most
workers were visited anyway, one Python call each).

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

import cython

from router.pricing.candidate import Row
from router.pricing.corrections import size_bucket
from router.pricing.cost_model import CostModel
from router.pricing.formula import (
    COMPILED,
    D_COLUMNS,
    P_COLUMNS,
    colocated_keys,
    decode_keys,
    least,
    prefill_keys,
    smallest,
)
from router.pricing.routes import colocated_key, colocated_row, pair_row, prefill_side
from router.pricing.shapes import RequestShape
from router.pricing.worker_costs import WorkerCosts
from router.types import Route

if cython.compiled:  # the terms as C calls (router/pricing/formula.pxd)
    from cython.cimports.router.pricing.formula import handoff_ms, route_key
else:
    from router.pricing.formula import handoff_ms, route_key

_CACHE_SIZE = 4
"""Tables kept by rows identity (plan() may decide twice on one snapshot: avoid, then fit)."""
_FIRST = operator.itemgetter(0)


_P_COLUMNS: dict[str, Callable[[WorkerCosts], object]] = {
    "p_queue": operator.attrgetter("queue_ms"),
    "p_base": operator.attrgetter("pre_base"),
    "p_tok": operator.attrgetter("pre_tok"),
    "p_pair": operator.attrgetter("pre_pair"),
    "p_ids": lambda r: r.worker.worker_id,
    "p_abi": lambda r: r.worker.cache_abi_digest,
}
"""Per-row columns of the prefill-capable side (CostTable attributes; formula.P_COLUMNS first)."""

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
    "d_live": operator.attrgetter("live"),
    "d_planned": operator.attrgetter("planned"),
    "d_next": operator.attrgetter("next_start_ms"),
    "d_ids": lambda r: r.worker.worker_id,
    "d_abi": lambda r: r.worker.cache_abi_digest,
}
"""Per-row columns of the decode-capable side (CostTable attributes; formula.D_COLUMNS first)."""

assert tuple(_P_COLUMNS)[:len(P_COLUMNS)] == P_COLUMNS and tuple(_D_COLUMNS)[:len(D_COLUMNS)] == D_COLUMNS


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
        _set_arrays(new)
        return new

    def price(self, model: CostModel, req: RequestShape, top_k: int,
              usable: Callable[[WorkerCosts], bool] | None = None, split: bool = True, colocated: bool = True,
              ) -> list[Row]:
        """What `reference_candidates` returns, as Rows (router/pricing/candidate.py): the
        pairs and colocated workers it would price, in its order, priced by
        router/pricing/routes.py."""
        k = max(0, top_k)
        h0, p_hit, d_hit = self._hits(req)
        if usable is None:
            p_idx, d_idx = range(len(self.p_rows)), range(len(self.d_rows))
        else:
            p_idx = [i for i, r in enumerate(self.p_rows) if usable(r)]
            d_idx = [i for i, r in enumerate(self.d_rows) if usable(r)]
        if not d_idx:
            return []
        n, m, bs, blocks = req.prompt_tokens, req.max_tokens, req.block_size, req.prompt_blocks
        np_, nd = len(self.p_rows), len(self.d_rows)
        tp_at, dms_at, key_at = self.tp_at, self.dms_at, self.key_at
        s = self._scratch[:]
        split = bool(split and p_idx)
        if split:  # P: queue + prefill of its compute set
            prefill_keys(self.a_p, np_, n - h0 * bs, h0 * bs, s)
            for i, hit in p_hit.items():
                s[i] = self.p_rows[i].queued_prefill_ms(n - hit * bs, hit * bs)
        # D: TPOT with this request and, for splits, admission + the cheap transfer bound
        # at the all-paths factor.
        ms_per_byte = model.transfer_ms("", "", 1 << 20) / (1 << 20) if split else 0.0
        decode_keys(self.a_d, nd, n + m // 2, max(1, m - 1), blocks - h0, ms_per_byte, split, s, tp_at)
        if split:
            for i, hit in d_hit.items():
                r = self.d_rows[i]
                s[dms_at + i] = handoff_ms(r.admission_ms, blocks - hit, r.kv_bytes_per_block, ms_per_byte)
        full = usable is None
        ttft_ref = req.slo_ttft_ms or max(1.0, (least(s, 0, np_) if full else min(s[i] for i in p_idx))
                                          if split else 1.0)
        tpot_ref = req.slo_tpot_ms or max(1e-3, least(s, tp_at, nd) if full else min(s[tp_at + i] for i in d_idx))
        if colocated:
            col_overhead = model.overhead_ms(Route.COLOCATED)
            self._colocated_keys(req, h0, d_hit, s, col_overhead, ttft_ref, tpot_ref)
        spans, among = [], []
        if split:
            spans += [(0, np_), (dms_at, nd), (tp_at, nd)]
            among += [p_idx, d_idx, d_idx]
        if colocated:
            spans.append((key_at, nd))
            among.append(d_idx)
        picks = _tops(s, spans, among, k, full)
        out = self._pairs(model, req, k, s, picks[0], picks[1] + picks[2], ttft_ref, tpot_ref, h0, p_hit, d_hit) \
            if split else []
        if colocated:
            out += [colocated_row(self.d_rows[i], req, col_overhead, d_hit.get(i, h0)) for i in picks[-1]]
        return out

    def _hits(self, req: RequestShape) -> tuple[int, dict[int, int], dict[int, int]]:
        """(the usable prefix hit of a worker the index does not name, then position -> usable
        hit blocks of the prefill rows and of the decode rows the index names)."""
        ub = req.usable_blocks
        h0 = 0 if ub >= 0 else ub
        p_hit: dict[int, int] = {}
        d_hit: dict[int, int] = {}
        for w, h in req.hits.items():
            h = h if h < ub else ub
            for i in self.p_at.get(w, ()):
                p_hit[i] = h
            for i in self.d_at.get(w, ()):
                d_hit[i] = h
        return h0, p_hit, d_hit

    def _pairs(self, model, req, k, s, top_p, top_d, ttft_ref, tpot_ref, h0, p_hit, d_hit):
        """The k best pairs among the k best P by p_ms (`top_p`) and the k best D by each
        of d_ms and TPOT (`top_d`, both lists), priced."""
        tp_at, dms_at = self.tp_at, self.dms_at
        d_rows, d_ids, d_abi = self.d_rows, self.d_ids, self.d_abi
        top_d = {id(d_rows[j]): j for j in top_d}.values()
        top_d = [(j, d_ids[j], d_abi[j], s[dms_at + j], s[tp_at + j]) for j in top_d]
        overhead, lag, m = model.overhead_ms(Route.DISAGGREGATED), model.handoff_lag_ms(), req.max_tokens
        spread = 1.0 / (m - 1) if m > 1 else 0.0
        p_ids, p_abi = self.p_ids, self.p_abi
        top_p = [(i, p_ids[i], p_abi[i], s[i]) for i in top_p]
        # Two clocks (routes.pair_row): token 0 from P; the hand-off in D's token gaps.
        keyed = [(route_key(pm + overhead, tp + (dm + lag) * spread, ttft_ref, tpot_ref), i, j)
                 for i, pid, pabi, pm in top_p
                 for j, did, dabi, dm, tp in top_d if did != pid and dabi == pabi]
        keyed.sort(key=_FIRST)
        p_rows, out, sides = self.p_rows, [], {}  # the top pairs mostly share one P: its side once
        for _, i, j in keyed[:k]:
            side = sides.get(i)
            if side is None:
                side = sides[i] = prefill_side(p_rows[i], req, p_hit.get(i, h0))
            out.append(pair_row(model, p_rows[i], d_rows[j], req, overhead, side, d_hit.get(j, h0)))
        return out

    def _colocated_keys(self, req, h0, d_hit, s, overhead, ttft_ref, tpot_ref):
        """Each D row's colocated key (routes.colocated_key) into the key segment of `s`: the rows
        the prefix index does not name in one column pass, the named ones one by one."""
        n, m, reused = req.prompt_tokens, req.max_tokens, h0 * req.block_size
        colocated_keys(self.a_d, len(self.d_rows), self._d_scale_at(n - reused), n - reused, reused, n + m // 2,
                       max(1, m - 1), overhead, ttft_ref, tpot_ref, s, self.key_at)
        for i, hit in d_hit.items():
            s[self.key_at + i] = colocated_key(self.d_rows[i], req, overhead, hit, ttft_ref, tpot_ref)

    def _d_scale_at(self, new: int) -> array:
        """Each D row's prefill scale for `new` tokens (WorkerCosts.prefill_scale), per size bucket."""
        bucket = size_bucket(new)
        scale = self._d_scale.get(bucket)
        if scale is None:
            scale = self._d_scale[bucket] = array("d", [r.prefill_scale(new) for r in self.d_rows])
        return scale


def _set_arrays(t: CostTable) -> None:
    """The column blocks of router/pricing/formula.py (`a_p`, `a_d`: its P_COLUMNS and
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
    in router/pricing/formula.py when that runs compiled and `among` is every position
    (`full`) and no value is NaN."""
    if COMPILED and full:
        top = smallest(s, spans, k)
        if top is not None:
            return top
    return [sorted(idx, key=lambda i, o=off: s[o + i])[:k] for (off, _), idx in zip(spans, among)]


def _positions(rows: list[WorkerCosts]) -> dict[str, tuple[int, ...]]:
    at: dict[str, tuple[int, ...]] = {}
    for i, r in enumerate(rows):
        at[r.worker.worker_id] = (*at.get(r.worker.worker_id, ()), i)
    return at
