# cython: annotation_typing=True, boundscheck=False, wraparound=False, initializedcheck=False
"""The per-row loops of CostTable.price (router/pricing/cost_table.py), typed for Cython.

A snapshot's table keeps its float columns in two flat `array('d')` blocks,
column-major: the prefill-capable side's P_COLUMNS (`CostTable.a_p`) and the
decode-capable side's D_COLUMNS (`CostTable.a_d`); column c of n rows is
[c*n, (c+1)*n). One request's keys go to one scratch `array('d')` laid out as
[p_ms | tp | d_ms | key]; the functions here fill its segments and pick the k
smallest positions of each. A typed argument costs a buffer acquisition per
call (a memoryview object), so the loops take whole blocks and offsets rather
than one column each: four calls a request instead of ~25 acquisitions.

Compiled (router/native.py), the annotations make them C loops over doubles;
as plain Python (no build, or PD_ROUTER_NATIVE=0) the same code runs as
ordinary loops, with `cython` the shadow module Cython ships.

The formulas are CostTable's keys term for term, in the same order, so the
doubles come out bit-identical to the Python floats of `reference_candidates`
(router/pricing/decision.py): every operation is one IEEE-754 double operation either
way (ints convert exactly, below 2**53), and the build turns off floating-point
contraction (no fused multiply-add). tests/unit/router/pricing/test_decision_table.py
and tests/unit/router/test_native.py check both builds against the reference.
"""

from __future__ import annotations

import cython

COMPILED: bool = cython.compiled
"""This module runs as a build (C loops), not as Python."""

P_COLUMNS = ("p_qb", "p_tok", "p_pair")
"""CostTable columns in `a_p`, in this order (queue + prefill base, per token, pair term)."""
D_COLUMNS = ("d_tpb", "d_tpt", "d_queue", "d_adm", "d_kvb", "d_pb", "d_pt", "d_pp", "d_chunk", "d_step", "d_live")
"""CostTable columns in `a_d`, in this order (flags and ints as exact doubles)."""



def prefill_keys(a: cython.double[:], n: cython.Py_ssize_t, new: cython.double, c: cython.double,
                 out: cython.double[:]) -> None:
    """out[i] = qb[i] + tok[i] * new + pair[i] * new * c for the n rows of block `a`
    (queue + prefill of `new` tokens), into out[0:n]."""
    i: cython.Py_ssize_t
    tok: cython.Py_ssize_t = n  # column offsets in `a` (P_COLUMNS' order)
    pair: cython.Py_ssize_t = 2 * n
    for i in range(n):
        out[i] = a[i] + a[tok + i] * new + a[pair + i] * new * c


def decode_keys(a: cython.double[:], n: cython.Py_ssize_t, ctx: cython.double, gaps: cython.double,
                moved: cython.double, ms_per_byte: cython.double, split: cython.bint, out: cython.double[:],
                off: cython.Py_ssize_t) -> None:
    """For the n rows of block `a`: out[off + i] = tpb + tpt * ctx + queue / gaps (TPOT with
    this request, WorkerCosts.tpot_with without extra prefill) and, when `split`,
    out[off + n + i] = adm + moved * kvb * ms_per_byte (admission + the cheap transfer bound)."""
    i: cython.Py_ssize_t
    tpt: cython.Py_ssize_t = n  # column offsets in `a` (D_COLUMNS' order)
    qu: cython.Py_ssize_t = 2 * n
    adm: cython.Py_ssize_t = 3 * n
    kvb: cython.Py_ssize_t = 4 * n
    for i in range(n):
        out[off + i] = a[i] + a[tpt + i] * ctx + a[qu + i] / gaps
    if split:
        for i in range(n):
            out[off + n + i] = a[adm + i] + moved * a[kvb + i] * ms_per_byte


def colocated_keys(a: cython.double[:], n: cython.Py_ssize_t, scale: cython.double[:], scaled: cython.bint,
                   new: cython.longlong, c: cython.double, gaps: cython.double, overhead: cython.double,
                   ttft_ref: cython.double, tpot_ref: cython.double, out: cython.double[:],
                   tp_off: cython.Py_ssize_t, off: cython.Py_ssize_t) -> None:
    """out[off + i] = (qu + o + -(-new // chunk) * step + overhead) / ttft_ref
                     + (tp + (o / gaps if live else 0.0)) / tpot_ref,
    o = (pb + pt * new + pp * new * c) * scale (WorkerCosts.prefill_ms; scale 1.0
    unless `scaled`), tp = out[tp_off + i]: the colocated key of CostTable._colocated
    for new > 0 (a scale of 1.0 and an added 0.0 are exact). `//` is Python's floor
    division here too (ZeroDivisionError on 0)."""
    i: cython.Py_ssize_t
    o: cython.double
    chunks: cython.double
    chunk: cython.longlong
    qu: cython.Py_ssize_t = 2 * n  # column offsets in `a` (D_COLUMNS' order)
    pb: cython.Py_ssize_t = 5 * n
    pt: cython.Py_ssize_t = 6 * n
    pp: cython.Py_ssize_t = 7 * n
    ch: cython.Py_ssize_t = 8 * n
    step: cython.Py_ssize_t = 9 * n
    live: cython.Py_ssize_t = 10 * n
    for i in range(n):
        chunk = cython.cast(cython.longlong, a[ch + i])
        chunks = -((-new) // chunk)
        o = (a[pb + i] + a[pt + i] * new + a[pp + i] * new * c) * (scale[i] if scaled else 1.0)
        if a[live + i] != 0.0:
            out[off + i] = ((a[qu + i] + o + chunks * a[step + i] + overhead) / ttft_ref
                            + (out[tp_off + i] + o / gaps) / tpot_ref)
        else:
            out[off + i] = ((a[qu + i] + o + chunks * a[step + i] + overhead) / ttft_ref
                            + (out[tp_off + i] + 0.0) / tpot_ref)


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
