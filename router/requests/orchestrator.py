"""Request orchestration: admission, the retry policy, deadlines and cancellation.

Lifecycle of one request (each arrow is one place in this file):

    submit:  admit (static checks) -> duplicate check -> snapshot -> check_cluster
             -> plan (router/requests/planner.py: the mode's route for attempt 1, or an
                admission reject with RESOURCE_EXHAUSTED before any work)
    serve:   attempt 1 on the plan's route and workers; then, on failure,
             attempts 2 .. max_attempts, each a new generation g:
               disaggregated on the best untried (P, D) pair, priced as attempt 1
               (router/requests/planner.py Planner.place), at most
               max_disaggregated_attempts times (only when the request wants
               disaggregation and a prefill worker exists), then colocated on a
               decode-capable worker; workers that failed (in this request, or
               router-wide in the last failure_cooldown_ms) are avoided when an
               alternative exists; when the only workers left failed to answer
               in this request (UNAVAILABLE), it waits up to unreachable_wait_ms
               for the cluster to change (a restart re-registers), and no longer
               than that: then UNAVAILABLE, naming them (no wait for K/V room there)
    end:     Complete | RouterError (every attempt listed) | DEADLINE_EXCEEDED |
             CANCELLED (Complete with finish_reason CANCELLED once tokens flowed)

Each request runs in its own task, so the client's RPC, Router.Cancel and the
request deadline all stop it the same way: cancel the task; the attempt in
flight tears itself down (Cancel reaches P and D) before the task ends.

Safety invariant: a request id is registered in `_runs` from submit until its
task is done, so a duplicate in-flight id is rejected with ALREADY_EXISTS and
Router.Cancel always finds the attempt that holds worker state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from router.config import RouterConfig
from router.gateway import DirectoryGateway, WorkerGateway
from router.pricing.shapes import Outcome
from router.requests.admission import Admitted, admit, check_cluster
from router.requests.attempt import Attempt
from router.requests.attempts import AttemptRunner, RouterReach
from router.requests.cluster_view import ClusterView
from router.requests.inflight import InFlight
from router.requests.output import OutputLog
from router.requests.placement import FailureMemory
from router.requests.planner import Plan, Planner
from router.requests.queueing import AdmissionQueue
from router.requests.request_run import RecentGenerations, RequestRun
from router.requests.retries import RetryPolicy
from router.types import Event, GenerateParams, PrefillDone, RouterError, StatusCode, TokenOut
from runtime.common.tasks import TaskSet
from runtime.directory.records import ClusterSnapshot
from runtime.telemetry.catalog import RouterMetrics

log = logging.getLogger(__name__)


class Orchestrator(RetryPolicy):
    """Admits requests, runs their attempts and keeps the in-flight registry."""

    def __init__(self, workers: WorkerGateway, directory: DirectoryGateway, config: RouterConfig,
                 tokenizer: Any | None = None, clock: Callable[[], float] = time.monotonic,
                 mint: Callable[..., bytes] | None = None):
        self.mint = mint
        """(manifest, reservation) -> a signed transfer capability; None: hand-offs carry none."""
        self.workers = workers
        self.directory = directory
        self.config = config
        self.tokenizer = tokenizer
        self.view = ClusterView(directory, config, clock)
        self.failures = FailureMemory(config.failure_cooldown_ms / 1000.0, clock)
        self.planner = Planner(config, clock)
        self.inflight = InFlight(self.view.overlay, self.planner.streams, config)
        """This router's load holds and stream bookings (router/requests/inflight.py)."""
        self.default_mode = config.default_mode
        """Mode of requests with mode UNSPECIFIED (router/requests/planner.py); Admin.SetMode changes it."""
        self._clock = clock
        self._runs: dict[str, RequestRun] = {}
        self._background = TaskSet()
        self.queue = AdmissionQueue(self.view.overlay, self.view.get, per_tenant=config.queue_per_tenant,
                                    poll_s=config.queue_poll_ms / 1000.0,
                                    fence_ttl_s=config.overlay_ttl_ms / 1000.0, clock=clock)
        """Requests waiting for K/V room (router/requests/queueing.py)."""
        self.metrics = RouterMetrics()
        """This router's families (runtime/telemetry/catalog.py), served on /metrics."""
        self.metrics.bind(lambda: len(self._runs), lambda: self.queue.waiting)
        self.generations = RecentGenerations(config.recent_request_ids)
        """The last generation of recently served request ids: a client re-using one
        starts above it instead of colliding with the earlier run's transactions."""

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet finished."""
        return len(self._runs)

    def claims(self) -> dict[tuple[str, str], int]:
        """(tenant, request id) of each request in flight -> the generation of its latest
        attempt (0 before the first): what may still hold worker blocks (router/blocks.py)."""
        return {(r.req.tenant, rid): r.latest_generation() for rid, r in list(self._runs.items())}

    async def submit(self, params: GenerateParams) -> RequestRun:
        """Admit a request and start it; raises RouterError when it is rejected."""
        start_s = self._clock()
        req = admit(params, self.config, self.default_mode, self.tokenizer)
        if req.request_id in self._runs:
            raise RouterError(StatusCode.ALREADY_EXISTS, f"request {req.request_id!r} is already in flight")
        run = RequestRun(req, start_s, OutputLog(start_s, self._clock, self.tokenizer))
        self._runs[req.request_id] = run
        run.trace.attach()  # what submit calls, and the request's task, are the request's
        try:
            cluster = await self.view.get()
            if run.cancel_reason is not None:  # cancelled while in admission
                raise RouterError(StatusCode.CANCELLED, f"request cancelled: {run.cancel_reason}")
            check_cluster(req, cluster)
            with run.trace.decide() as span:
                run.plan = self._plan(req, cluster)
                run.trace.decided(span, run.plan)
        except BaseException as exc:
            del self._runs[req.request_id]
            if isinstance(exc, RouterError):
                self.metrics.ended(req.mode, "none", "cancelled" if exc.code is StatusCode.CANCELLED else "rejected")
            run.end(exc if isinstance(exc, RouterError) else RouterError(StatusCode.INTERNAL, repr(exc)))
            run.trace.detach()
            raise
        run.held = self.inflight.hold_plan(run.plan, req)
        run.booked = self.inflight.book(run.plan)
        run.req = req = dataclasses.replace(req, route=run.plan.route)
        reach = RouterReach(self.workers, self.directory, self.inflight, self.config, self._spawn, self.view, self.mint)
        run.runner = AttemptRunner(req, reach, run.output, lambda event: self._emit(run, event),
                                   lambda: self._remaining_s(run),
                                   on_prefill=lambda att, done: self._on_prefill(run, att, done))
        run.task = asyncio.create_task(self._serve(run), name=f"request {req.request_id}")
        run.task.add_done_callback(lambda _t: self._on_done(run))
        run.trace.detach()
        return run

    async def generate(self, params: GenerateParams) -> AsyncIterator[Event]:
        """Submit and stream; leaving the iteration early cancels the request."""
        run = await self.submit(params)
        try:
            async for event in run.stream():
                yield event
        finally:
            run.cancel("client went away")

    async def cancel(self, request_id: str, reason: str = "cancelled by client", tenant: str | None = None) -> bool:
        """Cancel an in-flight request (of `tenant` only, when given) and wait (briefly)
        for its teardown; False if unknown."""
        run = self._runs.get(request_id)
        if run is None or tenant not in (None, run.req.tenant):
            return False
        run.cancel(reason or "cancelled by client")
        if run.task is not None:  # else still in admission: it ends there, CANCELLED
            await asyncio.wait({run.task}, timeout=3 * self.config.cancel_timeout_s + 1.0)
        return True

    async def drain(self) -> None:
        """Wait until every request and every teardown task has finished."""
        while self._runs or self._background:
            await asyncio.gather(*[r.task for r in self._runs.values()], self._background.wait(),
                                 return_exceptions=True)

    async def close(self) -> None:
        """Cancel every request, wait for teardowns, close the gateways."""
        for run in list(self._runs.values()):
            run.cancel("router shutting down")
        await self.drain()
        await self.workers.close()
        await self.directory.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        return self._background.spawn(coro)

    def _remaining_s(self, run: RequestRun) -> float | None:
        return None if run.req.deadline_s is None else run.req.deadline_s - (self._clock() - run.start_s)

    def _plan(self, req: Admitted, cluster: ClusterSnapshot) -> Plan:
        """The mode's plan for attempt 1; raises RESOURCE_EXHAUSTED when auto mode
        predicts no route meets the request's SLO (nothing was dispatched)."""
        slo = self.planner.slo(req.tenant, req.slo)
        plan = self.planner.plan(req.request_id, req.tenant, req.prompt, req.max_tokens, req.mode, slo, cluster,
                                 self.view.overlay, self.failures.penalties(cluster))
        if plan.outcome is Outcome.REJECT:
            log.info("request %s rejected at admission: %s", req.request_id, plan.reason)
            raise RouterError(StatusCode.RESOURCE_EXHAUSTED, f"admission rejected the request: {plan.reason}")
        return plan

    def _emit(self, run: RequestRun, event: Event) -> None:
        if isinstance(event, TokenOut):
            run.trace.first_token()
            if run.migrated_at is not None:  # the request's first token since its migration
                self.metrics.resumed(self._clock() - run.migrated_at)
                run.migrated_at = None
                run.trace.resumed()
            if run.booked is not None and event.decoding:  # the booked stream decodes
                self.inflight.started(run.booked)
        run.emit(event)

    def _unbook(self, run: RequestRun) -> None:
        self.inflight.drop(run.booked)
        run.booked = None

    def _release(self, run: RequestRun) -> None:
        self.inflight.release(run.held)
        run.held = []

    def _on_prefill(self, run: RequestRun, att: Attempt, done: PrefillDone) -> None:
        self.metrics.transfer_completions.inc()
        self.planner.prefill_done(run.plan, att.prefill, att.decode, done)

    def _on_done(self, run: RequestRun) -> None:
        self._release(run)
        self._unbook(run)
        self._runs.pop(run.req.request_id, None)
        self.planner.log.finish(run.req.request_id, run.cancel_reason or (run.failures[-1] if run.failures else ""))
        # A task cancelled before it ever ran skipped _serve's handlers.
        run.end(RouterError(StatusCode.CANCELLED, f"request cancelled: {run.cancel_reason or 'router stopped'}"))
        self.metrics.ended(run.req.mode, *run.ending())

    async def _serve(self, run: RequestRun) -> None:
        req = run.req
        try:
            async with asyncio.timeout(req.deadline_s):
                run.end(await self._attempts(run))
        except TimeoutError:
            run.end(self._deadline_passed(run))
        except asyncio.CancelledError:
            if run.cancel_reason is None:
                raise
            if run.output.tokens:
                last = run.runner.last
                run.end(run.output.completed(run.cancel_finish, last.route if last else req.route,
                                             last.generation if last else 0))
            else:
                run.end(RouterError(StatusCode.CANCELLED, f"request cancelled: {run.cancel_reason}"))
        except RouterError as exc:
            run.end(exc)
        except Exception as exc:  # a bug: fail this request, keep serving others
            log.exception("request %s failed unexpectedly", req.request_id)
            run.end(RouterError(StatusCode.INTERNAL, f"router error: {exc!r}"))

    def _deadline_passed(self, run: RequestRun) -> RouterError | None:
        """DEADLINE_EXCEEDED once the request's deadline passed (None before): also when its
        attempts' calls, whose deadlines are the request's, failed before the timer fired."""
        left = self._remaining_s(run)
        return None if left is None or left > 0 else run.deadline_error()
