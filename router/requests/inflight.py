"""This router's work in flight, which the directory's snapshot cannot show yet.

The ledger owns both kinds of bookkeeping the requests leave behind until the
workers' heartbeats report them:

* load holds in the cluster view's `LoadOverlay` (router/requests/placement.py):
  a route's reserved blocks at its decode worker and its prompt queued at the
  computing worker, held from the plan (so a burst's requests, all planned before
  the first attempt runs, do not pile onto one worker) and again by each attempt
  until its token 0;
* stream bookings in the planner's `StreamBook` (router/requests/streams.py): when a
  planned decode stream will run beside the prefills planned after it.

Every hold and booking taken here is given back here (`release`, `drop`), exactly
once, on every path: the orchestrator releases a request's at its end, an attempt
its own in its teardown.
"""

from __future__ import annotations

from collections.abc import Iterable

from router.config import RouterConfig
from router.requests.admission import Admitted
from router.requests.placement import LoadOverlay
from router.requests.planner import Plan
from router.requests.streams import StreamBook
from router.types import Route
from runtime.directory.records import WorkerRecord


class InFlight:
    """Load holds and stream bookings of this router's requests (one per router)."""

    def __init__(self, overlay: LoadOverlay, streams: StreamBook, config: RouterConfig):
        self.overlay = overlay
        self.streams = streams
        self._cfg = config

    def __len__(self) -> int:
        """Holds and bookings not given back (0 once every request ended)."""
        return len(self.overlay) + len(self.streams)

    # ---- load holds -------------------------------------------------------------
    def hold_route(self, req: Admitted, computing: WorkerRecord, decode: WorkerRecord,
                   planned: bool = False) -> tuple[int, int]:
        """Hold a route's load: the reservation's blocks at the decode worker and the
        prompt queued at the computing worker (P, or the colocated worker) until token 0.
        Returns the (blocks, prefill) handles to `release`. The blocks count until a report
        taken after the worker confirmed them (`confirm`) shows them."""
        return (self.overlay.add(decode, blocks=req.demand.blocks_on(decode), planned=planned,
                                 confirmed=planned),
                self.overlay.add(computing, prefill_tokens=len(req.prompt), planned=planned))

    def hold_plan(self, plan: Plan, req: Admitted) -> list[int]:
        """Hold the planned route now, as its attempt will: a burst's requests are all
        planned before the first attempt runs, and would otherwise all see the same
        loads and pile onto the same worker."""
        computing = plan.decode if plan.route is Route.COLOCATED else plan.prefill
        if plan.decode is None or computing is None:
            return []
        return list(self.hold_route(req, computing, plan.decode, planned=True))

    def confirm(self, handle: int | None) -> None:
        """The worker holds the blocks `handle` counts (router/requests/placement.py LoadOverlay.confirm)."""
        self.overlay.confirm(handle)

    def release(self, handles: Iterable[int | None]) -> None:
        """Give holds back (idempotent per handle; None is no hold)."""
        for handle in handles:
            self.overlay.remove(handle)

    # ---- stream bookings --------------------------------------------------------
    def book(self, plan: Plan) -> int | None:
        """Book the planned stream, so the requests planned next know when it will decode
        beside their prefills. With `stream_start_windows`, its start is
        `stream_start_share` of the earliest it can be: the predicted TTFT less the queue
        ahead of its prefill; without, now (it counts as decoding from its plan). Queue
        estimates are what burst predictions overstate most (a queue of long prompts
        predicted at 7 s drained in 3), and a start booked too late lets prefills run
        beside a stream the router thinks has not started."""
        if plan.decode is None:
            return None
        c = plan.predicted
        if c is None or not self._cfg.stream_start_windows:
            return self.streams.book(plan.decode, 0.0)  # starts now: every prefill beside it stalls it
        return self.streams.book(plan.decode, self._cfg.stream_start_share * (c.ttft_ms - c.queue_ms))

    def started(self, booking: int | None) -> None:
        """The booked stream produced its first token."""
        self.streams.started(booking)

    def drop(self, booking: int | None) -> None:
        """The booked stream ended (or never ran)."""
        self.streams.drop(booking)
