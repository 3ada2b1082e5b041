"""Directory membership of a worker: register with a lease, heartbeat the load, leave.

Every start registers anew and gets a new epoch. If a heartbeat finds the
lease lost (the directory expired it, or a newer epoch exists), the directory
has already aborted this worker's unpublished transactions; the worker drops
its own unpublished state (`on_lease_lost`) and registers again.

Readiness (`on_ready`, the worker's gRPC health): True once registered, False
when a heartbeat finds the lease lost (True again once re-registered) and when
no heartbeat got through for a whole lease (the directory has expired it by
now, or is about to), True again at the next one that does. While the directory
is unreachable at start the worker keeps trying to register, NOT_SERVING.

A draining worker `leave`s: heartbeats stop and it deregisters (the directory
drops it now, as if its lease expired, so routers stop choosing it at once); a
lease lost while leaving is not registered again.

Heartbeats go a lease third apart, and sooner when the load moved: checked every
`min_report_interval_s`, a heartbeat leaves as soon as free blocks, the decode batch or
the queued prompt tokens moved by `report_change` of the worker's capacity since the
last report, or its connector was disabled or enabled. Routers place on these reports
(each router counts its own dispatches until a report shows them), so a burst's load, or
its end, reaches every router in a fraction of a second instead of seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from runtime.directory.client import DirectoryClient
from runtime.directory.records import DirectoryUnavailable, LoadReport, WorkerInfo

log = logging.getLogger(__name__)

REGISTER_BACKOFF_MAX_S = 2.0
"""Longest wait between two registration attempts while the directory is away."""


class Membership:
    """Keeps one worker registered; `epoch` is current after `start`."""

    def __init__(self, client: DirectoryClient, info: WorkerInfo,
                 load_fn: Callable[[], LoadReport],
                 on_lease_lost: Callable[[], Awaitable[None]] | None = None,
                 on_ready: Callable[[bool], Awaitable[None]] | None = None,
                 clock: Callable[[], float] = time.monotonic, report_change: float = 0.0,
                 min_report_interval_s: float = 0.25):
        self.client = client
        self.info = info
        self.load_fn = load_fn
        self.on_lease_lost = on_lease_lost
        self.on_ready = on_ready
        self.clock = clock
        self.epoch = 0
        self.lease_ttl_s = 5.0
        self.live_until = 0.0
        """Clock time until which the lease is known to hold (from the last renewal sent)."""
        self.leaving = False
        self.routes_stopped = False
        """The directory's last word: a rollback stopped new disaggregated routes, so this
        worker refuses transfer work (runtime/worker/node.py `TRANSFER_WORK`)."""
        self._task: asyncio.Task | None = None
        self.report_change, self.min_report_interval_s = report_change, min_report_interval_s
        self.reported: LoadReport | None = None
        """The load of the last heartbeat sent."""

    async def _ready(self, ready: bool) -> None:
        if self.on_ready is not None:
            await self.on_ready(ready)

    def _routes(self, stopped: bool) -> None:
        if stopped != self.routes_stopped:
            log.warning("%s: a rollback %s new disaggregated routes: transfer work %s", self.info.worker_id,
                        "stopped" if stopped else "lifted the stop on", "refused" if stopped else "accepted again")
        self.routes_stopped = stopped

    async def register(self) -> int:
        """Register (new epoch) and return the epoch."""
        sent = self.clock()
        reg = await self.client.register_worker(self.info)
        self.epoch = reg.epoch
        self._routes(reg.routes_stopped)
        self.lease_ttl_s = max(reg.lease_ttl_ms / 1000.0, 0.3)
        self.live_until = sent + self.lease_ttl_s
        log.info("registered %s epoch %d lease %.1fs", self.info.worker_id, self.epoch,
                 self.lease_ttl_s)
        await self._ready(True)
        return self.epoch

    async def start(self, attempts: int | None = None) -> None:
        """Register (retrying while the directory is unreachable: `attempts` times, or
        until it answers when None) and start heartbeats. A refusal (a certificate that
        does not name this worker, a malformed registration) raises at once."""
        delay_s, i = 0.2, 0
        while True:
            try:
                await self.register()
                break
            except DirectoryUnavailable as e:
                i += 1
                if attempts is not None and i >= attempts:
                    raise
                log.warning("directory not ready (%s); retrying in %.1fs", e, delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, REGISTER_BACKOFF_MAX_S)
        self._task = asyncio.create_task(self._beat(), name="heartbeat")

    async def heartbeat_now(self) -> None:
        """Send one heartbeat (load report) right away."""
        sent, load = self.clock(), self.load_fn()
        lease = await self.client.heartbeat(self.info.worker_id, self.epoch, load)
        self.reported = load
        self._routes(lease.routes_stopped)
        if lease.ok:
            self.live_until = sent + self.lease_ttl_s
            await self._ready(True)
            return
        log.warning("lease of %s epoch %d lost%s", self.info.worker_id, self.epoch,
                    "" if self.leaving else "; re-registering")
        self.live_until = 0.0
        await self._ready(False)
        if self.on_lease_lost is not None:
            await self.on_lease_lost()
        if not self.leaving:
            await self.register()

    async def _next_beat(self) -> None:
        """Wait a lease third, or less once the load moved (checked every
        `min_report_interval_s`, so reports never come closer than that)."""
        period = self.lease_ttl_s / 3
        if self.report_change <= 0:
            await asyncio.sleep(period)
            return
        waited = 0.0
        while waited < period:
            step = min(self.min_report_interval_s, period - waited)
            await asyncio.sleep(step)
            waited += step
            if self.moved(self.load_fn()):
                return

    def moved(self, load: LoadReport) -> bool:
        """Has `load` moved enough since the last report to send one now?"""
        last, cap, share = self.reported, self.info.capacity, self.report_change
        if last is None or share <= 0:
            return False
        if load.connector_disabled != last.connector_disabled:
            return True
        scales = ((load.free_blocks, last.free_blocks, load.total_blocks or cap.total_blocks),
                  (load.active_decode_batch, last.active_decode_batch, cap.max_decode_batch),
                  (load.pending_prefill_tokens, last.pending_prefill_tokens, cap.max_prefill_tokens))
        return any(whole and abs(now - before) >= max(1.0, share * whole) for now, before, whole in scales)

    async def _beat(self) -> None:
        while True:
            await self._next_beat()
            try:
                await self.heartbeat_now()
            except asyncio.CancelledError:
                raise
            except DirectoryUnavailable as e:
                log.warning("heartbeat failed: %s", e)
            except Exception:  # keep beating
                log.exception("heartbeat error")
            if self.clock() > self.live_until:  # no renewal for a whole lease: presumed lost
                await self._ready(False)

    async def stop(self) -> None:
        """Stop heartbeating (the lease then expires)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass

    async def leave(self, timeout_s: float = 2.0) -> bool:
        """Stop heartbeating and deregister now (best effort: when the directory cannot
        answer within `timeout_s`, the lease expires by itself); True if deregistered."""
        self.leaving = True
        await self.stop()
        try:
            done = await self.client.deregister_worker(self.info.worker_id, self.epoch, timeout_s)
        except (DirectoryUnavailable, ValueError) as e:
            log.warning("deregister %s epoch %d failed (%s); its lease will expire", self.info.worker_id,
                        self.epoch, e)
            return False
        log.info("deregistered %s epoch %d%s", self.info.worker_id, self.epoch,
                 "" if done else " (its lease had already lapsed)")
        return done
