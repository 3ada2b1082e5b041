"""runtime/common/heap.py: the start-up heap leaves the cycle collector's walks."""

from __future__ import annotations

import gc

from runtime.common.heap import freeze_startup_heap


def test_the_startup_heap_is_frozen_and_later_objects_are_still_collected():
    kept = [[i] for i in range(20_000)]  # a start-up heap's worth of long-lived objects
    try:
        walked_before = len(gc.get_objects())
        frozen = freeze_startup_heap()
        assert frozen > len(kept)
        # What it froze, less what died since: frozen objects still die by reference
        # counting, here or on another of the process's threads (pytest-xdist's).
        assert frozen - 1000 < gc.get_freeze_count() <= frozen
        assert len(gc.get_objects()) < walked_before - len(kept)  # a full collection walks fewer
        cycle = []
        cycle.append(cycle)  # made after the freeze: still the collector's
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
