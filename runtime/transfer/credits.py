"""Byte-credit window (docs/design.md, Contracts): bounds the bytes a sender has in flight to one destination.

    acquire(n)  before a chunk is issued; waits (FIFO) while the window is full
    release(n)  when the destination reports the chunk visible, or — for a failed
                chunk — only once the abort has fenced every callback that could
                still touch its memory

Invariant: 0 <= in_flight <= capacity at every instant, except that one chunk
larger than the whole window may go alone (in_flight == its size) so that an
oversized chunk cannot deadlock. `peak` and `acquired`/`released` totals are
kept for tests and metrics.
"""

from __future__ import annotations

import asyncio
import collections


class CreditTimeout(TimeoutError):
    """No credit became free within the caller's timeout."""


class CreditWindow:
    """Byte credits for one destination; every method runs on the event loop's thread."""

    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError(f"credit window must be positive, got {capacity}")
        self.capacity = capacity
        self.in_flight = 0
        self.peak = 0
        self.acquired = 0
        self.released = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    def _fits(self, n: int) -> bool:
        return self.in_flight + n <= self.capacity or self.in_flight == 0

    async def acquire(self, n: int, timeout_s: float | None = None) -> None:
        """Take n bytes of credit, waiting behind earlier callers; CreditTimeout on timeout."""
        if n < 0:
            raise ValueError("negative credit")
        if not self._waiters and self._fits(n):
            self._take(n)
            return
        fut = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout_s):
                await fut
        except BaseException as e:
            if fut.done() and not fut.cancelled():  # granted just as we gave up: give it back
                self.release(n)
            else:
                self._waiters.remove(entry)
                self._grant()
            if isinstance(e, TimeoutError):
                raise CreditTimeout(f"no {n} bytes of credit in {timeout_s} s "
                                    f"({self.in_flight} of {self.capacity} in flight)") from None
            raise

    def release(self, n: int) -> None:
        """Return n bytes of credit."""
        if n < 0 or n > self.in_flight:
            raise ValueError(f"release of {n} bytes with {self.in_flight} in flight")
        self.in_flight -= n
        self.released += n
        self._grant()

    def _take(self, n: int) -> None:
        self.in_flight += n
        self.acquired += n
        self.peak = max(self.peak, self.in_flight)

    def _grant(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            n, fut = self._waiters.popleft()
            if not fut.done():
                self._take(n)
                fut.set_result(None)
