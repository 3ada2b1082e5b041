"""A prefill job that finds the block pool full waits for room: queued, not shed.

The router admits a request by its decode worker's room; nothing bounds what the
prefill worker holds at the same moment. It holds a prompt's blocks from its job to
its verdict and gives them back on its engine thread after the reply, so in a burst
(a decode that ends early frees its blocks before the prefill's come back) the
prefill's pool can be full for a moment while its own prefills in flight are about to
free theirs. Failing the job then (RESOURCE_EXHAUSTED) costs the request an attempt
for a condition that lasts milliseconds.

`PoolQueue.allocate` waits instead, first come first served (a small prompt that
would fit does not overtake a large one that waits), until the allocation fits: each
prefill's release wakes the head, and a poll covers blocks freed by anything else on
the engine (a mixed worker's decodes). A job whose blocks exceed the whole pool never
fits and fails at once. The wait ends with the caller's cancel or the prefill TTL
(both cancel the waiting task), never with a held block.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from runtime.engine import OutOfBlocks

T = TypeVar("T")


class PoolQueue:
    """The prefill jobs waiting for room in the block pool, oldest first."""

    def __init__(self, poll_s: float = 0.02, on_wait: Callable[[], object] | None = None):
        self.poll_s = poll_s
        """How often the head retries without a release to wake it."""
        self.on_wait = on_wait
        """Called as a job starts waiting (pd_prefill_pool_waits_total)."""
        self._turns: collections.deque[asyncio.Future] = collections.deque()
        self._freed = asyncio.Event()
        self.waiting_tokens = 0
        """Prompt tokens of the jobs waiting (the load report's pending prefill counts them)."""

    def __len__(self) -> int:
        return len(self._turns)

    def freed(self) -> None:
        """Blocks went back to the pool: the head tries again."""
        self._freed.set()

    async def allocate(self, attempt: Callable[[], Awaitable[T]], tokens: int) -> T:
        """`attempt()` (an allocation that raises OutOfBlocks, holding nothing, when the pool
        lacks room) once it fits, behind the jobs already waiting."""
        if not self._turns:
            try:
                return await attempt()
            except OutOfBlocks as e:
                if e.needed_blocks > e.total_blocks:
                    raise
        turn = asyncio.get_running_loop().create_future()
        self._turns.append(turn)
        self.waiting_tokens += tokens
        if self.on_wait is not None:
            self.on_wait()
        try:
            if self._turns[0] is not turn:
                await turn  # the job ahead got its blocks (or left)
            while True:
                self._freed.clear()  # a release from here on wakes the retry below
                try:
                    return await attempt()
                except OutOfBlocks as e:
                    if e.needed_blocks > e.total_blocks:
                        raise
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_s):
                        await self._freed.wait()
        finally:
            head = self._turns[0] is turn
            self._turns.remove(turn)
            self.waiting_tokens -= tokens
            if head and self._turns and not self._turns[0].done():  # (done: cancelled, its finally passes it on)
                self._turns[0].set_result(None)
