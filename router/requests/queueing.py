"""The admission queue: a burst waits for K/V room instead of being shed.

A request about to dispatch an attempt needs room for its K/V blocks on some
decode-capable worker, as this router sees it (heartbeat load minus its own
unreported dispatches, `LoadOverlay`). When there is room and nobody is waiting,
it goes at once (no cost on the common path). Otherwise it waits here:

  * one FIFO per tenant, bounded (`per_tenant`); tenants are served round robin,
    so a tenant's burst cannot starve another tenant's single request;
  * a waiter is granted when its demand fits; the grant counts the demand in
    the overlay at once (a hold the attempt's own dispatch replaces), so one
    release of room is not granted to several waiters;
  * a waiter leaves with RESOURCE_EXHAUSTED when what is left of its deadline
    no longer covers its predicted service time ("cannot be served in time");
    earlier than that it keeps its place.

Room is re-checked whenever an attempt ends in this router (`kick`) and every
`poll_s` while anyone waits (other routers' requests end too; the cluster view
refreshes at most every snapshot_max_age_ms). A worker that answered
RESOURCE_EXHAUSTED although the snapshot showed room is counted full until a
newer heartbeat shows otherwise (`fence_full`): retries go to other workers, or
wait, instead of hitting the same saturated worker again.

Safety invariant: between a grant and the attempt's dispatch there is no await,
or the grant's hold covers the gap; a waiter holds no overlay room.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

from router.requests.placement import LoadOverlay, free_blocks, rejects
from router.types import RouterError, StatusCode
from runtime.directory.records import ClusterSnapshot, WorkerRecord

log = logging.getLogger(__name__)

Fits = Callable[[ClusterSnapshot], "WorkerRecord | None"]
"""The decode-capable worker with room for a request now (most room first), or None."""


@dataclasses.dataclass(eq=False, slots=True)
class _Waiter:
    tenant: str
    request_id: str
    fits: Fits
    blocks: Callable[[WorkerRecord], int]
    granted: asyncio.Future
    since_s: float
    priority: int = 0


class AdmissionQueue:
    """Per-tenant FIFOs of requests waiting for K/V room, granted round robin."""

    def __init__(self, overlay: LoadOverlay, cluster: Callable[[], Awaitable[ClusterSnapshot]], *,
                 per_tenant: int = 256, poll_s: float = 0.05, fence_ttl_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self._overlay = overlay
        self.fence_ttl_s = fence_ttl_s
        self._full: dict[str, tuple[int, int, float]] = {}
        """Worker id -> (epoch, lease expiry, until): fenced full (`fence_full`)."""
        self._cluster = cluster
        self.per_tenant = per_tenant
        self.poll_s = poll_s
        self._clock = clock
        self._queues: dict[str, collections.deque[_Waiter]] = {}
        self._turn: collections.deque[str] = collections.deque()
        """Tenants with waiters, in round-robin order (the head is served next)."""
        self._kick = asyncio.Event()
        self._pump_task: asyncio.Task | None = None
        self.granted_total = 0
        self.expired_total = 0

    @property
    def waiting(self) -> int:
        """Requests waiting now."""
        return sum(len(q) for q in self._queues.values())

    def waiting_of(self, tenant: str) -> int:
        """Requests of `tenant` waiting now."""
        return len(self._queues.get(tenant, ()))

    def kick(self) -> None:
        """Room may have been released (an attempt ended): re-check the waiters."""
        self._kick.set()

    def room_for(self, demand) -> Fits:
        """A `Fits` for `demand`: the decode-capable worker whose free blocks (this
        router's unreported dispatches included) hold the request's, most room first;
        workers fenced full are skipped."""
        def fits(cluster: ClusterSnapshot) -> WorkerRecord | None:
            best, best_free = None, 0
            for w in cluster.workers:
                if not w.can_decode or rejects(w, demand) is not None or self._fenced(w):
                    continue
                free = free_blocks(w, self._overlay, planned=False)
                if free >= demand.blocks_on(w) and (best is None or free > best_free):
                    best, best_free = w, free
            return best
        return fits

    def fence_full(self, worker: WorkerRecord) -> None:
        """`worker` refused for lack of blocks although this router's view showed room:
        count it full until a heartbeat newer than that view (its lease expiry moves),
        a new incarnation, or `fence_ttl_s`."""
        self._full[worker.worker_id] = (worker.epoch, worker.lease_expiry_ms,
                                        self._clock() + self.fence_ttl_s)

    def fenced(self, cluster: ClusterSnapshot, weight: int = 4) -> dict[str, int]:
        """Placement penalties of the workers fenced full (placement then prefers others)."""
        return {w.worker_id: weight for w in cluster.workers if self._fenced(w)}

    def _fenced(self, w: WorkerRecord) -> bool:
        entry = self._full.get(w.worker_id)
        if entry is None:
            return False
        epoch, lease, until = entry
        if (w.epoch, w.lease_expiry_ms) != (epoch, lease) or self._clock() >= until:
            del self._full[w.worker_id]
            return False
        return True

    def go_now(self, tenant: str, fits: Fits, cluster: ClusterSnapshot) -> bool:
        """True when a request may dispatch without waiting: there is room for it
        and no request of its tenant is waiting (nobody is overtaken in its FIFO;
        other tenants' waiters need room this one's demand does not take away)."""
        return not self._queues.get(tenant) and fits(cluster) is not None and not self._starved(cluster)

    async def wait(self, tenant: str, request_id: str, fits: Fits, blocks: Callable[[WorkerRecord], int],
                   patience_s: float | None, priority: int = 0) -> int:
        """Wait for room; returns the overlay handle of the grant's hold (the caller
        removes it once its attempt counts its own dispatch). Raises RouterError
        RESOURCE_EXHAUSTED when the queue is full or `patience_s` runs out. `priority`:
        the waiter goes ahead of its tenant's waiters of lower priority (never another
        tenant's: tenants stay round robin)."""
        queue = self._queues.get(tenant)
        if queue is not None and len(queue) >= self.per_tenant:
            raise RouterError(StatusCode.RESOURCE_EXHAUSTED,
                              f"admission queue of tenant {tenant!r} is full ({len(queue)} requests "
                              f"waiting for K/V room)")
        if patience_s is not None and patience_s <= 0:
            raise RouterError(StatusCode.RESOURCE_EXHAUSTED,
                              "no K/V room now, and what is left of the deadline does not cover the "
                              "request's predicted service time")
        waiter = _Waiter(tenant, request_id, fits, blocks, asyncio.get_running_loop().create_future(),
                         self._clock(), priority)
        if queue is None:
            queue = self._queues[tenant] = collections.deque()
            self._turn.append(tenant)
        ahead = next((i for i, w in enumerate(queue) if w.priority < priority), len(queue))
        queue.insert(ahead, waiter)
        self._ensure_pump()
        self.kick()
        try:
            async with asyncio.timeout(patience_s):  # not wait_for: it can swallow a cancel
                return await asyncio.shield(waiter.granted)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._overlay.remove(waiter.granted.result())  # granted as it gave up: give it back
                self.kick()
            self._leave(waiter)
            if isinstance(exc, asyncio.CancelledError):
                raise
            self.expired_total += 1
            waited = self._clock() - waiter.since_s
            raise RouterError(StatusCode.RESOURCE_EXHAUSTED,
                              f"no K/V room within the deadline: waited {waited * 1000:.0f} ms in the admission "
                              f"queue ({self.waiting} waiting); what was left no longer covers the predicted "
                              f"service time") from None

    # ---- the pump ----------------------------------------------------------
    def _ensure_pump(self) -> None:
        if self._pump_task is None or self._pump_task.done():
            self._pump_task = asyncio.get_running_loop().create_task(self._pump(), name="admission queue")

    async def _pump(self) -> None:
        while self._turn:
            self._kick.clear()
            try:
                cluster = await self._cluster()
            except RouterError as exc:  # no view: the waiters keep waiting (their patience bounds it)
                log.debug("admission queue: no cluster view: %s", exc.message)
            else:
                self._grant(cluster)
            if not self._turn:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await self._kick.wait()

    def _grant(self, cluster: ClusterSnapshot) -> None:
        """Serve tenants round robin: a pass offers each tenant's head, in turn order,
        the room there is; a tenant served goes to the back of the turn order, one not
        served keeps its place. Passes repeat while any grant was made."""
        progress = True
        while progress and self._turn:
            progress = False
            for tenant in list(self._turn):
                queue = self._queues.get(tenant)
                if not queue:
                    continue
                head = queue[0]
                if head.granted.done():  # gave up meanwhile
                    self._leave(head)
                    progress = True
                    continue
                worker = head.fits(cluster)
                if worker is None:
                    continue
                handle = self._overlay.add(worker, blocks=head.blocks(worker))
                head.granted.set_result(handle)
                self.granted_total += 1
                self._leave(head)
                if tenant in self._queues:
                    self._turn.remove(tenant)
                    self._turn.append(tenant)
                progress = True

    def _starved(self, cluster: ClusterSnapshot) -> bool:
        """Some waiter of another tenant fits now: it goes first (it waited)."""
        return any(q and not q[0].granted.done() and q[0].fits(cluster) is not None
                   for q in self._queues.values())

    def _leave(self, waiter: _Waiter) -> None:
        queue = self._queues.get(waiter.tenant)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            pass
        if not queue:
            del self._queues[waiter.tenant]
            try:
                self._turn.remove(waiter.tenant)
            except ValueError:
                pass
