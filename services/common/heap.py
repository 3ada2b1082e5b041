"""The start-up heap out of the cycle collector's way.

A server process that imported torch, grpc and its own code holds ~200,000 objects
that live as long as it does. CPython's full (generation-2) collection walks every
one of them, ~100 ms on the development machine: a pause in whatever request the
process serves at that moment. Once a process is ready to serve, `freeze_startup_heap`
collects once and moves everything alive into the permanent generation (gc.freeze),
so that a full collection walks only what was made since (~2 ms there). Nothing
changes for the objects themselves: they still die by reference counting.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def freeze_startup_heap() -> int:
    """Collect, then freeze every object alive; how many are frozen now."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("start-up heap frozen: %d objects left out of the cycle collector's walks (%.0f ms)",
             frozen, (time.perf_counter() - t0) * 1000)
    return frozen
