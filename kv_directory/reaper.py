"""The directory's background reaper: lease expiry without traffic, and readiness.

Every `interval_s` it calls the store's `reap_expired`, so a dead worker leaves the
snapshot and its unpublished transactions abort even when nobody calls the
directory. The same call is the directory's readiness probe of its store: the first
tick that finds Redis unreachable reports `reachable(False)` (gRPC health
NOT_SERVING: a directory that cannot vouch for its answers is not ready), the first
that reaches it again `reachable(True)`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from runtime.directory.records import DirectoryUnavailable

log = logging.getLogger(__name__)


async def reap_forever(reap: Callable[[], Awaitable[int]], interval_s: float,
                       reachable: Callable[[bool], Awaitable[None]] | None = None) -> None:
    """Call `reap` every `interval_s` until cancelled; `reachable(ok)` on each change
    of whether the store answered."""
    failing = False
    while True:
        await asyncio.sleep(interval_s)
        try:
            reaped = await reap()
        except DirectoryUnavailable as exc:
            if not failing:  # log the outage once, not every tick
                log.warning("reaper: store unavailable: %s", exc)
                if reachable is not None:
                    await reachable(False)
            failing = True
            continue
        except Exception:  # keep reaping: a bug here must not stop lease expiry
            log.exception("reaper: reap_expired failed")
            continue
        if failing:
            log.info("reaper: store reachable again")
            if reachable is not None:
                await reachable(True)
        failing = False
        if reaped:
            log.info("reaper: reaped %d expired workers/transactions", reaped)
