"""The router's view of the cluster: a short-lived cached directory snapshot
plus the overlay of its own dispatches the snapshot cannot show yet.

Many concurrent requests share one snapshot fetch (a lock serializes fetches,
which also keeps `LoadOverlay.observe` calls in fetch order). A request finding the
snapshot past its max age but within STALE_FACTOR times it is served the cached one
at once while one fetch runs in the background: the directory's answer is off every
request's path in steady traffic (it was ~1.2 ms on the path of one request in six at
a request every ~30 ms). Past that, or when a caller names its own max age (the
release controller, admin), the caller waits for the fetch.

Directory outage: colocated serving must not depend on the directory (it needs
no transaction). While the directory is unreachable the view is `degraded`: it
serves the last snapshot it got, whatever its age, asks the directory again at
most every `directory_retry_ms` (requests in between pay no timeout), and the
orchestrator places colocated routes only. A worker that died meanwhile fails its
attempt and the request retries elsewhere. The first snapshot that arrives with a
decode-capable worker ends the outage (after an outage longer than a lease the
directory knows no live worker until they register again), and disaggregated
routes resume.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from router.config import RouterConfig
from router.gateway import DirectoryGateway
from router.requests.placement import LoadOverlay
from router.types import RouterError, StatusCode, WorkerCallError
from runtime.directory.records import ClusterSnapshot

log = logging.getLogger(__name__)

STALE_FACTOR = 4
"""A snapshot up to this many max ages old is served while a fresh one is fetched in the
background (max age 0: never)."""


class ClusterView:
    """Cached ClusterSnapshot and dispatch overlay, shared by every request."""

    def __init__(self, directory: DirectoryGateway, config: RouterConfig,
                 clock: Callable[[], float] = time.monotonic):
        self._directory = directory
        self._config = config
        self._clock = clock
        self.overlay = LoadOverlay(config.overlay_ttl_ms / 1000.0, clock)
        self._cached: ClusterSnapshot | None = None
        self._cached_at = 0.0
        self._retry_at = 0.0
        self.degraded = False
        """True while the directory is unreachable and the last snapshot stands in."""
        self.routes_stopped = False
        """Set by the release controller (router/release) the moment this router stops new
        disaggregated routes, before any snapshot can say so."""
        self._lock = asyncio.Lock()
        self._refreshing: asyncio.Task | None = None
        """The background fetch under way, if any (one at a time)."""

    def _fresh(self, max_age_s: float) -> bool:
        return self._cached is not None and self._clock() - self._cached_at <= max_age_s

    def directory_unreachable(self) -> None:
        """A directory call other than the snapshot failed for want of the directory: treat
        it as an outage now, rather than when the cached snapshot next expires."""
        if self._cached is not None:
            if not self.degraded:
                log.warning("directory unreachable; placing colocated routes until it answers")
            self.degraded = True
            self._retry_at = self._clock() + self._config.directory_retry_ms / 1000.0

    def _waiting_to_retry(self) -> bool:
        return self.degraded and self._clock() < self._retry_at

    async def get(self, max_age_s: float | None = None) -> ClusterSnapshot:
        """A snapshot at most `max_age_s` old (default: the config's max age), or during a
        directory outage the last one (`degraded`).

        Raises RouterError(UNAVAILABLE) when the directory cannot be reached and no
        snapshot was ever fetched.
        """
        default = max_age_s is None
        max_age_s = self._config.snapshot_max_age_ms / 1000.0 if max_age_s is None else max_age_s
        if self._fresh(max_age_s) or self._waiting_to_retry():
            return self._cached
        if default and not self.degraded and self._fresh(STALE_FACTOR * max_age_s):
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.create_task(self._fetch(max_age_s), name="snapshot-refresh")
                self._refreshing.add_done_callback(lambda t: t.cancelled() or t.exception())
            return self._cached
        return await self._fetch(max_age_s)

    async def _fetch(self, max_age_s: float) -> ClusterSnapshot:
        """Ask the directory (unless another fetch made the snapshot fresh meanwhile)."""
        async with self._lock:
            if self._fresh(max_age_s) or self._waiting_to_retry():
                return self._cached  # another request refreshed (or tried) while we waited
            fetch_id = self.overlay.fetch_started()
            try:
                cluster = await self._directory.snapshot(self._config.directory_timeout_s)
            except WorkerCallError as exc:
                if self._cached is None:
                    raise RouterError(StatusCode.UNAVAILABLE,
                                      f"directory unreachable ({exc.code.name}: {exc.message}) and no "
                                      "cluster snapshot was ever fetched") from exc
                self.directory_unreachable()
                return self._cached
            if self.degraded and not any(w.can_decode for w in cluster.workers):
                # Back after an outage longer than a lease: the workers' leases lapsed while
                # nobody could renew them, and none has registered again yet. Keep serving
                # colocated on the last snapshot until one has (a heartbeat period).
                self._retry_at = self._clock() + self._config.directory_retry_ms / 1000.0
                return self._cached
            if self.degraded:
                log.warning("directory answers again; disaggregated routes resume")
            self.degraded = False
            self.overlay.observe(cluster, fetch_id)
            self._cached, self._cached_at = cluster, self._clock()
            return cluster

    @property
    def last(self) -> ClusterSnapshot | None:
        """The latest snapshot, whatever its age (None before the first): for checks that
        must not wait for the directory (router/edge/intake.py)."""
        return self._cached

    @property
    def colocated_only(self) -> bool:
        """No disaggregated route may start: the directory is unreachable (no transaction can
        run), or a rollback stopped new routes (this router's, or any router's: the snapshot)."""
        stopped = self._cached is not None and self._cached.release.routes_stopped
        return self.degraded or self.routes_stopped or stopped

    def routes_stopped_elsewhere(self) -> None:
        """The directory refused a reserve with ROUTES_STOPPED before this router's snapshot
        said so: stop here too (the next snapshot confirms it, or lifts it)."""
        self.routes_stopped = True
        self._cached_at = float("-inf")  # read the directory again at the next get()

    @property
    def latest(self) -> ClusterSnapshot | None:
        """The last snapshot fetched (None before the first), whatever its age."""
        return self._cached

    @property
    def route_epoch(self) -> int:
        """Route epoch of the latest snapshot (0 before the first)."""
        return self._cached.route_epoch if self._cached else 0
