"""The records the orchestrator keeps per request: `RequestRun` (one admitted
request: its task, its client events, its plan-time holds and failures) and
`RecentGenerations` (the last generation this router used per request id)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator

from router.requests.admission import Admitted
from router.requests.attempt import Attempt
from router.requests.attempts import AttemptRunner
from router.requests.output import OutputLog
from router.requests.planner import Plan
from router.requests.tracing import RequestTrace
from router.types import Completed, Event, FinishReason, RouterError, StatusCode
from runtime.directory.records import ClusterSnapshot


class RequestRun:
    """One admitted request: its task, its client event queue, its attempts."""

    def __init__(self, req: Admitted, start_s: float, output: OutputLog):
        self.req = req
        self.start_s = start_s
        self.output = output
        self.events: asyncio.Queue[Event | RouterError] = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.runner: AttemptRunner | None = None
        self.plan: Plan | None = None
        self.held: list[int] = []
        """Overlay handles taken at plan time for the planned route, so the next request
        planned before this one's attempt starts sees it; released when attempt 1 takes
        its own (or the request ends first)."""
        self.booked: int | None = None
        """StreamBook handle of the planned stream (router/requests/streams.py), until attempt 1
        fails or the request ends."""
        self.failures: list[str] = []
        self.refusals: list[str] = []
        """Attempts a worker refused for want of K/V room (sent back to the queue)."""
        self.migrated_at: float | None = None
        """When an attempt failed after tokens went out (None: not since the last token)."""
        self.cancel_reason: str | None = None
        self.cancel_finish = FinishReason.CANCELLED
        """How a request cancelled after tokens went out finishes (STOP: the client's stop
        string matched, router/http/stops.py; it has all it asked for)."""
        self.finished = False
        self.trace = RequestTrace(req)
        self.outcome: Completed | RouterError | None = None
        """The terminal event, once queued."""

    def emit(self, event: Event) -> None:
        """Queue an event for the client."""
        self.events.put_nowait(event)

    def end(self, outcome: Completed | RouterError) -> None:
        """Queue the terminal event (only the first one counts)."""
        if not self.finished:
            self.finished = True
            self.outcome = outcome
            self.events.put_nowait(outcome)
            self.trace.ended(outcome)

    def ending(self) -> tuple[str, str]:
        """(topology, result) of the ended request, for pd_route_total: the last attempt's
        route (none: it never ran one) and ok, cancelled or error."""
        last = self.runner.last if self.runner is not None else None
        topology = last.route.name.lower() if last is not None else "none"
        out = self.outcome
        if isinstance(out, Completed):
            return topology, "cancelled" if out.finish_reason is FinishReason.CANCELLED else "ok"
        return topology, "cancelled" if out is None or out.code is StatusCode.CANCELLED else "error"

    def latest_generation(self) -> int:
        """The generation of its latest attempt (0 before the first)."""
        return self.runner.last.generation if self.runner and self.runner.last else 0

    def deadline_error(self) -> RouterError:
        """DEADLINE_EXCEEDED saying where the request was and what failed before."""
        last = self.runner.last if self.runner else None
        where = f" during {last.describe()} at stage {last.stage.value}" if last else ""
        earlier = f"; earlier: {'; '.join(self.failures)}" if self.failures else ""
        return RouterError(StatusCode.DEADLINE_EXCEEDED,
                           f"request deadline of {self.req.deadline_s * 1000:.0f} ms passed{where}{earlier}")

    def cancel(self, reason: str, finish: FinishReason = FinishReason.CANCELLED) -> None:
        """Stop the request: its attempt tears down, then the stream ends with `finish`
        (CANCELLED, or STOP for a stop string) once tokens went out, CANCELLED before. A
        request still in admission (no task yet) is refused CANCELLED when admission ends.
        A no-op once the request finished (its terminal event queued)."""
        if self.finished or (self.task is not None and self.task.done()) or self.cancel_reason is not None:
            return
        self.cancel_reason, self.cancel_finish = reason, finish
        if self.task is not None:
            self.task.cancel()

    def planned_attempt(self, cluster: ClusterSnapshot, generation: int) -> Attempt | None:
        """Attempt 1 as planned, while its workers are still live at the planned epoch."""
        plan = self.plan
        if plan is None or plan.decode is None:
            return None
        live = {w.worker_id: w.epoch for w in cluster.workers}
        if any(w is not None and live.get(w.worker_id) != w.epoch for w in (plan.prefill, plan.decode)):
            return None
        return Attempt(generation, plan.route, decode=plan.decode, prefill=plan.prefill,
                       route_epoch=cluster.route_epoch)

    async def stream(self) -> AsyncIterator[Event]:
        """Client events until Complete; raises the request's RouterError."""
        while True:
            item = await self.events.get()
            if isinstance(item, RouterError):
                raise item
            yield item
            if isinstance(item, Completed):
                return


class RecentGenerations:
    """(tenant, request id) -> the highest generation this router used for it, for
    the last `capacity` request ids. A miss (another router replica ran it, or it was
    long ago) costs one decode reservation: the directory answers the generation."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._last: collections.OrderedDict[tuple[str, str], int] = collections.OrderedDict()

    def last(self, req: Admitted) -> int:
        """The generation to go above (0: none known)."""
        return self.last_of(req.tenant, req.request_id)

    def last_of(self, tenant: str, request_id: str) -> int:
        """The last generation used for `tenant`'s request `request_id` (0: none known)."""
        return self._last.get((tenant, request_id), 0)

    def note(self, req: Admitted, generation: int) -> None:
        """`generation` was used (or found used) for `req`."""
        key = (req.tenant, req.request_id)
        self._last[key] = max(generation, self._last.pop(key, 0))
        while len(self._last) > self.capacity:
            self._last.popitem(last=False)
