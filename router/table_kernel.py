# cython: annotation_typing=True, boundscheck=False, wraparound=False, initializedcheck=False
"""The per-row loops of CostTable.price (router/cost_table.py), typed for Cython.

Each function evaluates one pruning key over a snapshot's float columns
(`array('d')`), or picks the k smallest of one. Compiled (router/native.py),
the annotations make them C loops over doubles; as plain Python (no build, or
PD_ROUTER_NATIVE=0) the same code runs as ordinary loops, with `cython` the
shadow module Cython ships.

The formulas are CostTable's keys term for term, in the same order, so the
doubles come out bit-identical to the Python floats of `reference_candidates`
(router/decision.py): every operation is one IEEE-754 double operation either
way (ints convert exactly, below 2**53), and the build turns off floating-point
contraction (no fused multiply-add). tests/unit/test_router_decision_table.py
and tests/unit/test_router_native.py check both builds against the reference.
"""

from __future__ import annotations

import cython

COMPILED: bool = cython.compiled
"""This module runs as a build (C loops), not as Python."""


def tpot_keys(b: cython.double[:], t: cython.double[:], qu: cython.double[:], ctx: cython.double,
              gaps: cython.double, out: cython.double[:]) -> None:
    """out[i] = b[i] + t[i] * ctx + qu[i] / gaps (WorkerCosts.tpot_with, no extra prefill)."""
    i: cython.Py_ssize_t
    for i in range(len(b)):
        out[i] = b[i] + t[i] * ctx + qu[i] / gaps


def prefill_keys(a: cython.double[:], t: cython.double[:], p: cython.double[:], new: cython.double,
                 c: cython.double, out: cython.double[:]) -> None:
    """out[i] = a[i] + t[i] * new + p[i] * new * c (queue + prefill of `new` tokens)."""
    i: cython.Py_ssize_t
    for i in range(len(a)):
        out[i] = a[i] + t[i] * new + p[i] * new * c


def transfer_keys(a: cython.double[:], kv: cython.double[:], moved: cython.double, ms_per_byte: cython.double,
                  out: cython.double[:]) -> None:
    """out[i] = a[i] + moved * kv[i] * ms_per_byte (admission + the cheap transfer bound)."""
    i: cython.Py_ssize_t
    for i in range(len(a)):
        out[i] = a[i] + moved * kv[i] * ms_per_byte


def colocated_keys(qu: cython.double[:], b: cython.double[:], t: cython.double[:], p: cython.double[:],
                   scale: cython.double[:], chunk: cython.longlong[:], step: cython.double[:], tp: cython.double[:],
                   live: cython.double[:], new: cython.longlong, c: cython.double, gaps: cython.double,
                   overhead: cython.double, ttft_ref: cython.double, tpot_ref: cython.double,
                   out: cython.double[:]) -> None:
    """out[i] = (qu + o + -(-new // chunk) * step + overhead) / ttft_ref
               + (tp + (o / gaps if live else 0.0)) / tpot_ref,
    o = (b + t * new + p * new * c) * scale (WorkerCosts.prefill_ms): the colocated
    key of CostTable._colocated for new > 0 (a scale of 1.0 and an added 0.0 are
    exact). `//` is Python's floor division here too (ZeroDivisionError on 0)."""
    i: cython.Py_ssize_t
    o: cython.double
    chunks: cython.double
    for i in range(len(qu)):
        chunks = -((-new) // chunk[i])
        o = (b[i] + t[i] * new + p[i] * new * c) * scale[i]
        if live[i] != 0.0:
            out[i] = (qu[i] + o + chunks * step[i] + overhead) / ttft_ref + (tp[i] + o / gaps) / tpot_ref
        else:
            out[i] = (qu[i] + o + chunks * step[i] + overhead) / ttft_ref + (tp[i] + 0.0) / tpot_ref


def smallest(v: cython.double[:], k: cython.Py_ssize_t):
    """Positions of the k smallest values, ascending, equal values in position order:
    `sorted(range(len(v)), key=v.__getitem__)[:k]`. None when a value is NaN (no
    total order: the caller sorts in Python, as the reference does). O(k n): for the
    build; as Python, `sorted` is faster (CostTable uses it then)."""
    n: cython.Py_ssize_t = len(v)
    i: cython.Py_ssize_t
    j: cython.Py_ssize_t
    best: cython.Py_ssize_t
    pv: cython.double = 0.0
    pi: cython.Py_ssize_t = -1
    x: cython.double
    out: list = []
    for i in range(n):
        if v[i] != v[i]:
            return None
    if k > n:
        k = n
    for j in range(k):  # each pick: the least (value, position) after the previous pick
        best = -1
        for i in range(n):
            x = v[i]
            if pi >= 0 and (x < pv or (x == pv and i <= pi)):
                continue
            if best < 0 or x < v[best]:
                best = i
        out.append(best)
        pv, pi = v[best], best
    return out


def least(v: cython.double[:]) -> float:
    """min(v) as Python's min computes it (the first of equal values; a leading NaN stays)."""
    i: cython.Py_ssize_t
    cur: cython.double = v[0]
    for i in range(1, len(v)):
        if v[i] < cur:
            cur = v[i]
    return cur
