"""Heap settings for worker processes (glibc malloc).

A decode step allocates a few dozen tensors of 0.5–3 MB (gathered K/V,
scores, activations) and frees them before the next step. Measured in a
decode worker (`small`, two 1.5k-token sequences): every step took ~8,600
minor page faults and 27 ms of system time — 71 ms per step instead of 44 —
because those tensors came from fresh mappings (or from heap pages trimmed
back to the kernel) on every step, so each step paid to fault and zero them
again. glibc's dynamic mmap threshold should adapt, but in a process with
several arenas and some frees above its 32 MiB cap it did not here.

`tune_malloc` fixes both thresholds at start: blocks up to `mmap_threshold`
come from the heap, and the heap keeps up to `trim_threshold` of free memory
instead of returning it. The cost is resident memory that the process would
have given back (bounded by the trim threshold); workers hold a K/V cache of
hundreds of MB anyway.
"""

from __future__ import annotations

import logging

from runtime.common.heap import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, glibc_malloc

log = logging.getLogger(__name__)

MAX_MMAP_THRESHOLD = 32 << 20
"""glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit)."""

DEFAULT_TRIM_THRESHOLD = 512 << 20


def tune_malloc(mmap_threshold: int = MAX_MMAP_THRESHOLD,
                trim_threshold: int = DEFAULT_TRIM_THRESHOLD) -> bool:
    """Set glibc's mmap and trim thresholds; False (and a log line) where that is not possible.

    `PD_MALLOC_TUNE=0` turns it off (e.g. to measure without it).
    """
    libc = glibc_malloc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    ok = bool(mallopt(M_MMAP_THRESHOLD, min(mmap_threshold, MAX_MMAP_THRESHOLD)))
    ok &= bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
    if not ok:
        log.warning("mallopt refused the heap thresholds: decode steps may page-fault")
    return ok
