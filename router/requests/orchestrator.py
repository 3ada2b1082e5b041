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
               for the cluster to change (a restart re-registers) first
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
import functools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from router.config import RouterConfig
from router.gateway import DirectoryGateway, WorkerGateway
from router.pricing.shapes import Outcome
from router.requests.admission import Admitted, admit, check_cluster
from router.requests.attempt import DIRECTORY_RESERVE, Attempt, AttemptFailed, GenerationBehind
from router.requests.attempts import AttemptRunner
from router.requests.cluster_view import ClusterView
from router.requests.inflight import InFlight
from router.requests.output import OutputLog
from router.requests.placement import FailureMemory, has_prefill_worker
from router.requests.planner import Plan, Planner
from router.requests.queueing import AdmissionQueue
from router.requests.request_run import RecentGenerations, RequestRun
from router.requests.retries import Retries
from router.types import (
    Cluster,
    Completed,
    Event,
    FinishReason,
    GenerateParams,
    PrefillDone,
    Route,
    RouterError,
    StatusCode,
    TokenOut,
)
from services.common.tasks import TaskSet
from services.telemetry.catalog import RouterMetrics

log = logging.getLogger(__name__)


class Orchestrator:
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
        """This router's families (services/telemetry/catalog.py), served on /metrics."""
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
        run.runner = AttemptRunner(req, self.workers, self.directory, self.inflight, self.config, run.output,
                                   lambda event: self._emit(run, event), self._spawn, lambda: self._remaining_s(run),
                                   on_prefill=lambda att, done: self._on_prefill(run, att, done),
                                   view=self.view, mint=self.mint)
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

    def _plan(self, req: Admitted, cluster: Cluster) -> Plan:
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
                run.end(run.output.completed(FinishReason.CANCELLED, last.route if last else req.route,
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

    async def _attempts(self, run: RequestRun) -> Completed:
        """The retry policy; returns the Complete event or raises RouterError."""
        req, cfg = run.req, self.config
        r = Retries(cfg.max_disaggregated_attempts if req.route is Route.DISAGGREGATED else 0,
                    self.generations.last(req), failures=run.failures)  # above any earlier run of this id
        fits = self.queue.room_for(req.demand)
        while r.number < cfg.max_attempts and not self._deadline_passed(run):
            cluster = await self.view.get()
            self._release(run)  # the plan-time hold must not count against the request's own room
            if not self.queue.go_now(req.tenant, fits, cluster):  # wait for K/V room (router/requests/queueing.py)
                try:
                    self.view.overlay.remove(await self.queue.wait(
                        req.tenant, req.request_id, fits, req.demand.blocks_on, self._patience_s(run)))
                except RouterError as exc:
                    refused = f"; refused for room: {'; '.join(run.refusals[-2:])}" if run.refusals else ""
                    raise RouterError(exc.code, exc.message + refused) from None
                cluster = self.view.latest or cluster  # no await from here to the dispatch
            att = self._next_attempt(run, r, cluster, fits)
            if (att is None or r.into_unreachable(att)) and r.unreachable and self._wait_for_change(run, r):
                # Only workers that failed to answer in this request (or none) are left:
                # wait for the cluster to change rather than burn an attempt.
                await asyncio.sleep(cfg.queue_poll_ms / 1000.0)
                continue
            if att is None:
                break
            previous = run.runner.last
            r.dispatch(att)
            self.metrics.dispatched(att.number, att.route.name.lower(), req.route.name.lower(),
                                    previous.stage.value if previous is not None else None)
            self.generations.note(req, r.generation)
            try:
                with run.trace.attempt(att, r.number, req.route):
                    done = await run.runner.run(att)
            except GenerationBehind as exc:
                r.behind_hops += 1
                if r.behind_hops <= 2:  # nobody failed: the same attempt again, above the earlier run
                    log.info("request %s: %s", req.request_id, exc.message)
                    self._unbook(run)
                    r.generation = max(r.generation, exc.current)
                    self.generations.note(req, r.generation)
                    r.uncount(att)
                    continue
                r.failed(att, exc)  # no suspects: nobody's fault, only out of hops
                continue
            except AttemptFailed as exc:
                if exc.code is StatusCode.RESOURCE_EXHAUSTED and r.requeues < cfg.max_requeues:
                    # No room after all (the snapshot lagged, or another router filled it): no
                    # one failed. Count the worker full until it reports room, and queue again.
                    r.requeues += 1
                    run.refusals.append(f"{att.describe()}: {exc.message}")
                    log.info("request %s: %s found no room (%s); back to the admission queue",
                             req.request_id, att.describe(), exc.message)
                    self._unbook(run)
                    if exc.culprit is not None:
                        self.queue.fence_full(exc.culprit)
                    else:
                        await asyncio.sleep(min(0.05 * 2 ** r.requeues, 1.0))
                    r.uncount(att)
                    continue
                log.info("request %s: %s failed: %s", req.request_id, att.describe(), exc)
                self.metrics.attempt_failed(att.route.name.lower(), exc.code.name, att.discard_kv)
                self._unbook(run)  # a later attempt streams from elsewhere
                r.failed(att, exc)
                if exc.stage == DIRECTORY_RESERVE and exc.code in (StatusCode.UNAVAILABLE,
                                                                   StatusCode.DEADLINE_EXCEEDED):
                    self.view.directory_unreachable()
                if exc.culprit is not None and exc.code in (StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED):
                    self.failures.record(exc.culprit)
                continue
            finally:
                self.queue.kick()  # what the attempt held is free again
            completed = run.output.completed(done.finish_reason, att.route, r.number,  # the reply's, else the seal's
                                             att.prefill_kv_digest or att.sealed_kv_digest, done.kv_digest,
                                             "; ".join(run.failures))
            self.planner.completed(req.request_id, run.plan, completed, att.prefill, att.decode)
            slo = self.planner.slo(req.tenant, req.slo)
            self.metrics.completed(req.tenant, len(req.prompt), completed.ttft_ms / 1000, completed.tpot_ms / 1000,
                                   completed.num_tokens, slo.ttft_ms / 1000, slo.tpot_ms / 1000, att.route.name.lower())
            return completed
        raise self._deadline_passed(run) or r.exhausted()

    def _next_attempt(self, run: RequestRun, r: Retries, cluster: Cluster, fits) -> Attempt | None:
        """Attempt 1 as planned when its workers still can; otherwise placed now, avoiding
        what failed (a colocated worker that answers beats a pair with one that did not)."""
        first, g = r.number == 0, r.generation + 1
        penalties = r.avoid + Counter(self.failures.penalties(cluster)) + Counter(self.queue.fenced(cluster))
        att = run.planned_attempt(cluster, g) if first else None
        if att is not None and att.route is Route.DISAGGREGATED and self.view.colocated_only:
            att = None  # no transaction can run now (directory unreachable, or a rollback stopped routes)
        if att is not None and fits(Cluster((att.decode,), cluster.route_epoch)) is None:
            att = None  # the planned D has no room (any more): place where there is
        att = att or self._place(cluster, run, g, first, r.disaggregated_left > 0 and not self.view.colocated_only,
                                 penalties, r.tried)
        if att is not None and att.route is Route.DISAGGREGATED and r.into_unreachable(att):
            colocated = self._place(cluster, run, g, False, False, penalties, r.tried)
            if colocated is not None and not r.into_unreachable(colocated):
                att = colocated
        return att

    def _wait_for_change(self, run: RequestRun, r: Retries) -> bool:
        """True while the request may still wait (unreachable_wait_ms, within its patience)."""
        if r.wait_until is None:
            patience = self._patience_s(run)
            wait_s = self.config.unreachable_wait_ms / 1000.0
            r.wait_until = time.monotonic() + (wait_s if patience is None else min(wait_s, patience))
        return time.monotonic() < r.wait_until

    def _patience_s(self, run: RequestRun) -> float | None:
        """How long the request may wait for K/V room: what is left of its deadline less
        its predicted service time (the planner's prediction, else the config's default
        costs); None without a deadline."""
        left = self._remaining_s(run)
        if left is None:
            return None
        req, cfg, plan = run.req, self.config, run.plan
        if plan is not None and plan.predicted is not None:
            service_ms = plan.predicted.ttft_ms + plan.predicted.tpot_ms * max(0, req.max_tokens - 1)
        else:
            service_ms = (cfg.default_prefill_ms_per_token * len(req.prompt)
                          + cfg.default_decode_step_ms * req.max_tokens)
        return left - service_ms / 1000.0

    def _place(self, cluster: Cluster, run: RequestRun, generation: int, first: bool, disaggregated: bool,
               avoid: Counter[str], tried: set[tuple[str, str]]) -> Attempt | None:
        """The next attempt's route, priced as attempt 1's (Planner.place); None: no worker can take it."""
        req = run.req
        place = functools.partial(self.planner.place, req.tenant, req.prompt, req.max_tokens,
                                  self.planner.slo(req.tenant, req.slo), cluster, self.view.overlay)
        if disaggregated:
            c = place(True, avoid, tried)
            if c is not None:
                return Attempt(generation, Route.DISAGGREGATED, decode=c.decode, prefill=c.prefill,
                               route_epoch=cluster.route_epoch)
            if first:
                why = "no prefill worker" if not has_prefill_worker(cluster) else "no compatible (P, D) pair"
                log.info("request %s: %s; running colocated", req.request_id, why)
        c = place(False, avoid)
        if c is None:
            return None
        return Attempt(generation, Route.COLOCATED, decode=c.decode, route_epoch=cluster.route_epoch)
