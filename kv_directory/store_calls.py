"""How the directory's servicer makes its blocking store calls.

Every call may go to a thread pool (``pooled``): the event loop never waits for Redis.
The hand-off's own calls (a Reserve, a nonce check, a transition) are short Lua scripts
on the critical path of every disaggregated request, and the pool's hop costs them more
than Redis does: two thread wake-ups and the GIL handed across the pool's threads, ~0.3
ms a call on two cores (bench/directory.py). ``handoff`` therefore makes them on the
event loop itself, with a twin of the store whose every Redis call gives up after a small
budget (``DirectoryStore.inline_twin``), as long as Redis keeps answering within it:

- a store that has no twin (the in-memory one; Redis with replicas to wait for, whose
  WAIT is a replica round trip), or a budget of 0, keeps every call on the pool;
- the first call, and the first after a cool-off, is a probe: made with the twin on a
  pool thread, so a Redis that hangs never stops the loop;
- then, while no pool call is in flight (the loop would otherwise sit on the answers of
  others), the call runs inline;
- an answer slower than the budget is kept, and the calls after it go back to the pool
  for the cool-off; a twin that gives up (DirectoryUnavailable) has its call made again
  on the pool with the full store (its timeouts and retries) and starts a cool-off.
  Making it again is safe: the transitions are idempotent by state, and a Reserve and a
  nonce check carry the RPC's attempt token, so a script the twin's timeout cut off
  after it ran answers APPLIED the second time, not DUPLICATE.

``on_inline(outcome)`` counts each call the twin made: ``answered``, ``slow``,
``unavailable`` (pd_directory_store_inline_calls_total).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kv_directory.store import DirectoryStore
from runtime.directory.records import DirectoryUnavailable

T = TypeVar("T")

_GAVE_UP = object()


class StoreCalls:
    """A store's calls, on `threads` pool threads or inline (see the module docstring)."""

    def __init__(self, store: DirectoryStore, threads: int, *, budget_s: float, cool_off_s: float,
                 on_inline: Callable[[str], None] = lambda outcome: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self._twin = store.inline_twin(budget_s) if budget_s > 0 else None
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="directory-store")
        self._budget_s, self._cool_off_s = budget_s, cool_off_s
        self._on_inline, self._clock = on_inline, clock
        self._in_flight = 0
        self._proven = False  # the twin answered within budget since the last cool-off
        self._probing = False
        self._cool_until = float("-inf")

    async def pooled(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a pool thread."""
        self._in_flight += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))
        finally:
            self._in_flight -= 1

    async def handoff(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(store, *args)`, a hand-off call: with the twin, inline or as a probe, when
        it may; else on the pool with the full store."""
        if self._twin is None or self._clock() < self._cool_until or self._probing:
            return await self.pooled(fn, self.store, *args)
        if not self._proven:
            self._probing = True
            try:
                answer, took = await self.pooled(self._by_twin, fn, *args)
            finally:
                self._probing = False
        elif self._in_flight:
            return await self.pooled(fn, self.store, *args)
        else:
            answer, took = self._by_twin(fn, *args)
        if answer is _GAVE_UP:
            self._cool("unavailable")
            return await self.pooled(fn, self.store, *args)
        if took > self._budget_s:
            self._cool("slow")
        else:
            self._proven = True
            self._on_inline("answered")
        return answer

    def _by_twin(self, fn: Callable[..., T], *args: Any) -> tuple[Any, float]:
        started = self._clock()
        try:
            return fn(self._twin, *args), self._clock() - started
        except DirectoryUnavailable:
            return _GAVE_UP, self._clock() - started

    def _cool(self, outcome: str) -> None:
        self._proven, self._cool_until = False, self._clock() + self._cool_off_s
        self._on_inline(outcome)

    def close(self) -> None:
        """Drain the pool (call once no RPC needs the store), close the twin."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._twin is not None:
            self._twin.close()
