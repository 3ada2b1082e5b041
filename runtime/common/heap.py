"""The start-up heap out of the cycle collector's way.

A server process that imported torch, grpc and its own code holds ~200,000 objects
that live as long as it does. CPython's full (generation-2) collection walks every
one of them, ~100 ms on the development machine: a pause in whatever request the
process serves at that moment. Once a process is ready to serve, `freeze_startup_heap`
collects once and moves everything alive into the permanent generation (gc.freeze),
so that a full collection walks only what was made since (~2 ms there). Nothing
changes for the objects themselves: they still die by reference counting.

`glibc_malloc` gives the processes' heap settings (runtime/worker/memory.py,
router/edge/heap.py) glibc's malloc controls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import time

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # Must match glibc's malloc.h


def glibc_malloc() -> ctypes.CDLL | None:
    """The C library with `mallopt` and `malloc_trim` typed; None (said in a log line) when
    `PD_MALLOC_TUNE=0` turns heap tuning off, or the C library is not glibc."""
    if os.environ.get("PD_MALLOC_TUNE", "1") == "0":
        log.info("malloc tuning off (PD_MALLOC_TUNE=0)")
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError, TypeError):
        log.info("no mallopt in %s: heap settings left as glibc makes them", name)
        return None
    return libc


def freeze_startup_heap() -> int:
    """Collect, then freeze every object alive; how many are frozen now."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("start-up heap frozen: %d objects left out of the cycle collector's walks (%.0f ms)",
             frozen, (time.perf_counter() - t0) * 1000)
    return frozen
