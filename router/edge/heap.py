"""The router gives the memory of a large request back once the call is over (glibc malloc).

A request's message passes through blocks of its own size and many smaller ones
(gRPC's read slices, its contiguous copy, the bytes the intake reads). Left to
itself glibc kept them: it raises its mmap threshold to the largest block freed so
far (up to 32 MiB) and its trim threshold to twice that, and free memory between live
blocks, or at the top of a gRPC thread's arena, is never handed back. Three refused
7.4 MB prompts left the router ~20 MB larger for good. So, at start, `tune` fixes
both thresholds (a block of LARGE_BLOCK_BYTES or more gets a mapping of its own,
unmapped when freed) and keeps one arena (where gRPC's threads allocated, the trim
reaches too); and each call whose message was that large trims the heap when it is
over, and again TRIM_AGAIN_S later (`trim_after`; calls ending meanwhile share the
trims). The first keeps the next large request from landing on a fragmented heap;
the second catches what gRPC frees on its own time (a closed connection's read
buffers: a trim made only at once left 3 MB behind now and then, one made only later
let three requests in a row pile up past 4x). A connection that stays open keeps its
read buffers (up to ~3 MB here) until it closes. Measured: the same three, each from
a client of its own, left the router 0.2 MB larger.

The router makes large blocks only for large messages, and its threads mostly wait
on the GIL, so neither the extra mmap calls nor one arena cost anything measurable;
a trim takes ~1 ms. `PD_MALLOC_TUNE=0` turns all of it off, as for the workers
(whose heap settings keep memory instead: runtime/worker/memory.py).
"""

from __future__ import annotations

import asyncio
import logging

from runtime.common.heap import M_ARENA_MAX, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, glibc_malloc

log = logging.getLogger(__name__)

LARGE_BLOCK_BYTES = 1 << 20
"""Blocks of this size or more get a mapping of their own, and a call whose message is
this large trims the heap when it is over."""
TRIM_BYTES = 128 << 10
"""Free memory at the top of the heap beyond this goes back to the system (glibc's
default, fixed)."""
ARENAS = 1
TRIM_AGAIN_S = 0.5
"""How long after a large call is over the heap is trimmed a second time."""


class Heap:
    """The router's heap settings and its trims."""

    def __init__(self):
        self._libc = glibc_malloc()
        self._pending: set[float] = set()
        """Delays of the trims scheduled and not run yet."""
        self.trims = 0

    def tune(self) -> bool:
        """Fix the thresholds and the arenas, at start before serving; False when not done."""
        if self._libc is None:
            return False
        ok = all([self._libc.mallopt(option, value) for option, value in (
            (M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES), (M_TRIM_THRESHOLD, TRIM_BYTES), (M_ARENA_MAX, ARENAS))])
        if not ok:
            log.warning("mallopt refused the router's heap settings: large requests may leave memory behind")
        return ok

    def trim_after(self, context, message_bytes: int) -> None:
        """Trim the heap when the call of `context` is over, and TRIM_AGAIN_S later, if its
        message was large."""
        if self._libc is not None and message_bytes >= LARGE_BLOCK_BYTES:
            context.add_done_callback(self._call_over)

    def _call_over(self, _context) -> None:
        for delay_s in (0.0, TRIM_AGAIN_S):
            if delay_s not in self._pending:
                self._pending.add(delay_s)
                asyncio.get_running_loop().call_later(delay_s, self._trim, delay_s)

    def _trim(self, delay_s: float) -> None:
        self._pending.discard(delay_s)
        self._libc.malloc_trim(0)
        self.trims += 1
