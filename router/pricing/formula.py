# cython: annotation_typing=True, boundscheck=False, wraparound=False, initializedcheck=False
"""The route price formula, defined once: the scalar terms a route's price is made of,
and the loops that apply them to a snapshot's columns.

    prefill   queue + a + b*new + c*new*(reused + new/2)        queued_prefill_ms
              (a + b*new + c*new*(reused + new/2)) * scale        prefill_ms
    chunks    ceil(new / chunk): decode steps a chunked prefill interleaves with
    TPOT      base + per_token * (S + max_tokens // 2) + queued / (max_tokens - 1)   tpot_ms
    overlap   the part of a prefill that runs while the worker decodes     overlap_ms
    hand-off  admission + moved blocks * bytes per block * ms per byte     handoff_ms
    rank      TTFT / its reference + TPOT / its reference                   route_key

Everything that prices a route calls these: the cost rows' methods
(router/pricing/worker_costs.py `WorkerCosts`), the row builders
(router/pricing/routes.py), the cost table (router/pricing/cost_table.py) through the
column loops below, and the reference decision (router/pricing/reference.py).

This module is compiled with its annotations as C types (router/native.py `TYPED`):
the loops call the terms as C functions; the other modules call them as Python
functions. As plain Python (no build, or PD_ROUTER_NATIVE=0) the same code runs with
`cython` the shadow module Cython ships. Either way every operation is one IEEE-754
double operation in the order written (ints convert exactly below 2**53, `//` is
Python's floor division, and the build turns off fused multiply-add), so a term
gives the same double whoever calls it (tests/unit/router/test_native.py).

The loops: a snapshot's table keeps its float columns in two flat `array('d')`
blocks, column-major, the prefill-capable side's P_COLUMNS (`CostTable.a_p`) and
the decode-capable side's D_COLUMNS (`CostTable.a_d`); column c of n rows is
[c*n, (c+1)*n). One request's keys go to one scratch `array('d')` laid out as
[p_ms | tp | d_ms | key]. A typed argument costs a buffer acquisition per call (a
memoryview object), so the loops take whole blocks and offsets rather than one
column each.
"""

from __future__ import annotations

import cython

COMPILED: bool = cython.compiled
"""This module runs as a build (C loops), not as Python."""

P_COLUMNS = ("p_queue", "p_base", "p_tok", "p_pair")
"""CostTable columns in `a_p`, in this order (WorkerCosts queue_ms, pre_base, pre_tok, pre_pair)."""
D_COLUMNS = ("d_tpb", "d_tpt", "d_queue", "d_adm", "d_kvb", "d_pb", "d_pt", "d_pp", "d_chunk", "d_step", "d_live",
             "d_planned", "d_next")
"""CostTable columns in `a_d`, in this order (ints as exact doubles; d_next may be inf)."""


# ---- the terms ----------------------------------------------------------------------------------
def queued_prefill_ms(queue: cython.double, base: cython.double, per_token: cython.double,
                      per_pair: cython.double, new: cython.double, reused: cython.double) -> cython.double:
    """`queue` + the forward pass over `new` prompt tokens after `reused` cached ones, unscaled:
    queue + base + per_token * new + per_pair * new * (reused + new / 2). The P side's
    pruning key (a cheap bound: no size scale, no interleaved steps)."""
    return queue + base + per_token * new + per_pair * new * (reused + new / 2.0)


def prefill_ms(base: cython.double, per_token: cython.double, per_pair: cython.double, new: cython.longlong,
               reused: cython.longlong, scale: cython.double) -> cython.double:
    """The forward pass over `new` prompt tokens after `reused` cached ones, at the size
    correction `scale` (0 when there is nothing to compute)."""
    if new <= 0:
        return 0.0
    return queued_prefill_ms(0.0, base, per_token, per_pair, new, reused) * scale


def chunks(new: cython.longlong, chunk: cython.double) -> cython.double:
    """Chunks of at most `chunk` tokens a prefill of `new` tokens runs in: ceil(new / chunk)
    (floor division of exact integers, as a double or an int)."""
    return -((-new) // chunk)


def interleaved_ms(own: cython.double, new: cython.longlong, chunk: cython.double,
                   step: cython.double) -> cython.double:
    """A prefill that takes `own` alone, with one decode step of `step` between its chunks."""
    return own + chunks(new, chunk) * step


def overlap_ms(live: cython.double, planned: cython.double, next_start: cython.double, prefill: cython.double,
               end: cython.double) -> cython.double:
    """How much of a prefill of `prefill` ms ending `end` ms from now runs while the worker
    decodes: all of it with `live` streams, else what runs after the first of the
    `planned` ones starts (`next_start` ms from now; 0 when the prefill ends before)."""
    if live > 0:
        return prefill
    if planned <= 0 or end <= next_start:
        return 0.0
    after: cython.double = end - next_start
    return after if after < prefill else prefill  # min(prefill, after)


def tpot_ms(base: cython.double, per_token: cython.double, context: cython.double, queued: cython.double,
            gaps: cython.double) -> cython.double:
    """A stream's cadence: the step with it in the batch (`base` + `per_token` x its average
    context) plus `queued` prefill work spread over its `gaps` token gaps."""
    return base + per_token * context + queued / gaps


def handoff_ms(admission: cython.double, moved_blocks: cython.double, bytes_per_block: cython.double,
               ms_per_byte: cython.double) -> cython.double:
    """D's side of a split route's TTFT at a per-byte price: admission + the moved blocks' bytes."""
    return admission + moved_blocks * bytes_per_block * ms_per_byte


def route_key(ttft: cython.double, tpot: cython.double, ttft_ref: cython.double,
              tpot_ref: cython.double) -> cython.double:
    """A route's rank for pruning: each prediction relative to its target (or reference)."""
    return ttft / ttft_ref + tpot / tpot_ref


# ---- the loops over a table's columns -----------------------------------------------------------
def prefill_keys(a: cython.double[:], n: cython.Py_ssize_t, new: cython.double, reused: cython.double,
                 out: cython.double[:]) -> None:
    """out[i] = queued_prefill_ms of `new` tokens after `reused` for the n rows of block `a`."""
    i: cython.Py_ssize_t
    for i in range(n):  # column offsets in `a`: P_COLUMNS' order
        out[i] = queued_prefill_ms(a[i], a[n + i], a[2 * n + i], a[3 * n + i], new, reused)


def decode_keys(a: cython.double[:], n: cython.Py_ssize_t, ctx: cython.double, gaps: cython.double,
                moved: cython.double, ms_per_byte: cython.double, split: cython.bint, out: cython.double[:],
                off: cython.Py_ssize_t) -> None:
    """For the n rows of block `a`: out[off + i] = tpot_ms with this request (no extra
    prefill: WorkerCosts.tpot_with) and, when `split`, out[off + n + i] = handoff_ms of
    `moved` blocks (admission + the cheap transfer bound)."""
    i: cython.Py_ssize_t
    for i in range(n):  # column offsets in `a`: D_COLUMNS' order
        out[off + i] = tpot_ms(a[i], a[n + i], ctx, a[2 * n + i], gaps)
    if split:
        for i in range(n):
            out[off + n + i] = handoff_ms(a[3 * n + i], moved, a[4 * n + i], ms_per_byte)


def colocated_keys(a: cython.double[:], n: cython.Py_ssize_t, scale: cython.double[:], new: cython.longlong,
                   reused: cython.longlong, ctx: cython.double, gaps: cython.double, overhead: cython.double,
                   ttft_ref: cython.double, tpot_ref: cython.double, out: cython.double[:],
                   off: cython.Py_ssize_t) -> None:
    """out[off + i] = the colocated route's route_key on each of the n rows of block `a`, for
    `new` tokens after `reused` at the rows' size corrections `scale`: its TTFT (queue +
    prefill with interleaved steps + `overhead`) and its TPOT (with the part of its
    prefill that overlaps the row's streams), as router/pricing/routes.py `colocated_row`
    prices them."""
    i: cython.Py_ssize_t
    own: cython.double
    end: cython.double
    over: cython.double
    for i in range(n):  # column offsets in `a`: D_COLUMNS' order
        own = prefill_ms(a[5 * n + i], a[6 * n + i], a[7 * n + i], new, reused, scale[i])
        end = a[2 * n + i] + interleaved_ms(own, new, a[8 * n + i], a[9 * n + i])
        over = overlap_ms(a[10 * n + i], a[11 * n + i], a[12 * n + i], own, end)
        out[off + i] = route_key(end + overhead, tpot_ms(a[i], a[n + i], ctx, a[2 * n + i] + over, gaps),
                                 ttft_ref, tpot_ref)


def smallest(v: cython.double[:], spans: list, k: cython.Py_ssize_t):
    """For each (offset, length) of `spans`, the positions (relative to the offset) of the
    k smallest values of v[offset:offset+length], ascending, equal values in position
    order: `sorted(range(length), key=lambda i: v[offset + i])[:k]`. None when a value
    of a span is NaN (no total order: the caller sorts in Python, as the reference
    does). O(k n) per span: for the build; as Python, `sorted` is faster (CostTable
    uses it then)."""
    result: list = []
    off: cython.Py_ssize_t
    n: cython.Py_ssize_t
    i: cython.Py_ssize_t
    j: cython.Py_ssize_t
    kk: cython.Py_ssize_t
    best: cython.Py_ssize_t
    pi: cython.Py_ssize_t
    pv: cython.double
    x: cython.double
    out: list
    for off, n in spans:
        for i in range(n):
            if v[off + i] != v[off + i]:
                return None
        kk = k if k < n else n
        out = []
        pv, pi = 0.0, -1
        for j in range(kk):  # noqa: B007 - a typed counter: each pick, the least (value, position) after the last
            best = -1
            for i in range(n):
                x = v[off + i]
                if pi >= 0 and (x < pv or (x == pv and i <= pi)):
                    continue
                if best < 0 or x < v[off + best]:
                    best = i
            out.append(best)
            pv, pi = v[off + best], best
        result.append(out)
    return result


def least(v: cython.double[:], off: cython.Py_ssize_t, n: cython.Py_ssize_t) -> float:
    """min(v[off:off+n]) as Python's min computes it (the first of equal values; a
    leading NaN stays); n >= 1."""
    i: cython.Py_ssize_t
    cur: cython.double = v[off]
    for i in range(1, n):
        if v[off + i] < cur:
            cur = v[off + i]
    return cur
