"""The router's view of the cluster: a short-lived cached directory snapshot
plus the overlay of its own dispatches the snapshot cannot show yet.

Many concurrent requests share one snapshot fetch (a lock serializes fetches,
which also keeps `LoadOverlay.observe` calls in fetch order). If the directory
is unreachable, a cached snapshot up to `snapshot_stale_limit_ms` old still
serves: colocated routes need no directory, and disaggregated attempts will
fail at Directory.Reserve and fall back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from router.config import RouterConfig
from router.gateway import DirectoryGateway
from router.placement import LoadOverlay
from router.types import Cluster, RouterError, StatusCode, WorkerCallError

log = logging.getLogger(__name__)


class ClusterView:
    """Cached ClusterSnapshot and dispatch overlay, shared by every request."""

    def __init__(self, directory: DirectoryGateway, config: RouterConfig,
                 clock: Callable[[], float] = time.monotonic):
        self._directory = directory
        self._config = config
        self._clock = clock
        self.overlay = LoadOverlay(config.overlay_ttl_ms / 1000.0, clock)
        self._cached: Cluster | None = None
        self._cached_at = 0.0
        self._lock = asyncio.Lock()

    def _fresh(self, max_age_s: float) -> bool:
        return self._cached is not None and self._clock() - self._cached_at <= max_age_s

    async def get(self, max_age_s: float | None = None) -> Cluster:
        """A snapshot at most `max_age_s` old (default: the config's max age).

        Raises RouterError(UNAVAILABLE) when the directory cannot be reached
        and no snapshot within the stale limit is cached.
        """
        max_age_s = self._config.snapshot_max_age_ms / 1000.0 if max_age_s is None else max_age_s
        if self._fresh(max_age_s):
            return self._cached
        async with self._lock:
            if self._fresh(max_age_s):
                return self._cached  # another request refreshed it while we waited
            fetch_id = self.overlay.fetch_started()
            try:
                cluster = await self._directory.snapshot(self._config.directory_timeout_s)
            except WorkerCallError as exc:
                if self._fresh(self._config.snapshot_stale_limit_ms / 1000.0):
                    log.warning("directory snapshot failed (%s); using a cached one", exc)
                    return self._cached
                raise RouterError(StatusCode.UNAVAILABLE,
                                  f"directory unreachable ({exc.code.name}: {exc.message}) and no recent "
                                  "cluster snapshot is cached") from exc
            self.overlay.observe(cluster, fetch_id)
            self._cached, self._cached_at = cluster, self._clock()
            return cluster

    @property
    def route_epoch(self) -> int:
        """Route epoch of the latest snapshot (0 before the first)."""
        return self._cached.route_epoch if self._cached else 0
