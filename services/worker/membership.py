"""Directory membership of a worker: register with a lease, heartbeat the load.

Every start registers anew and gets a new epoch. If a heartbeat finds the
lease lost (the directory expired it, or a newer epoch exists), the directory
has already aborted this worker's unpublished transactions; the worker drops
its own unpublished state (`on_lease_lost`) and registers again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from services.directory.client import DirectoryClient
from services.directory.records import DirectoryUnavailable, LoadReport, WorkerInfo

log = logging.getLogger(__name__)


class Membership:
    """Keeps one worker registered; `epoch` is current after `start`."""

    def __init__(self, client: DirectoryClient, info: WorkerInfo,
                 load_fn: Callable[[], LoadReport],
                 on_lease_lost: Callable[[], Awaitable[None]] | None = None):
        self.client = client
        self.info = info
        self.load_fn = load_fn
        self.on_lease_lost = on_lease_lost
        self.epoch = 0
        self.lease_ttl_s = 5.0
        self._task: asyncio.Task | None = None

    async def register(self) -> int:
        """Register (new epoch) and return the epoch."""
        reg = await self.client.register_worker(self.info)
        self.epoch = reg.epoch
        self.lease_ttl_s = max(reg.lease_ttl_ms / 1000.0, 0.3)
        log.info("registered %s epoch %d lease %.1fs", self.info.worker_id, self.epoch,
                 self.lease_ttl_s)
        return self.epoch

    async def start(self, attempts: int = 50) -> None:
        """Register (retrying while the directory comes up) and start heartbeats."""
        for i in range(attempts):
            try:
                await self.register()
                break
            except DirectoryUnavailable as e:
                if i == attempts - 1:
                    raise
                log.warning("directory not ready (%s); retrying", e)
                await asyncio.sleep(0.2)
        self._task = asyncio.create_task(self._beat(), name="heartbeat")

    async def heartbeat_now(self) -> None:
        """Send one heartbeat (load report) right away."""
        lease = await self.client.heartbeat(self.info.worker_id, self.epoch, self.load_fn())
        if not lease.ok:
            log.warning("lease of %s epoch %d lost; re-registering", self.info.worker_id,
                        self.epoch)
            if self.on_lease_lost is not None:
                await self.on_lease_lost()
            await self.register()

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_s / 3)
            try:
                await self.heartbeat_now()
            except asyncio.CancelledError:
                raise
            except DirectoryUnavailable as e:
                log.warning("heartbeat failed: %s", e)
            except Exception:  # keep beating
                log.exception("heartbeat error")

    async def stop(self) -> None:
        """Stop heartbeating (the lease then expires)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
