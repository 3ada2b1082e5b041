"""The retry policy (`RetryPolicy._attempts`, a mixin of the Orchestrator) and one
request's retry bookkeeping across its attempts (`Retries`): what was tried, whom to
avoid, how many attempts and disaggregated attempts are left, and the attempts that do
not count (a worker that had no room after all; a request id that ran before).

    attempt 1 as planned; on failure, attempts 2 .. max_attempts, each a new generation:
      disaggregated on the best untried (P, D) pair (at most max_disaggregated_attempts),
      then colocated; workers that failed (here, or router-wide within the cooldown)
      avoided while an alternative exists; K/V room waited for in the admission queue,
      except on workers that failed to answer in this request; when only those are left,
      the request waits up to unreachable_wait_ms for the cluster to change, then fails
      UNAVAILABLE naming them
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections import Counter

from router.requests.attempt import DIRECTORY_RESERVE, Attempt, AttemptFailed, GenerationBehind
from router.requests.placement import has_prefill_worker
from router.requests.request_run import RequestRun
from router.types import Completed, Route, RouterError, StatusCode
from runtime.directory.records import ClusterSnapshot

log = logging.getLogger("router.requests.orchestrator")  # (its records keep their logger's name)


@dataclasses.dataclass
class Retries:
    disaggregated_left: int
    """Disaggregated attempts still allowed (then colocated)."""
    generation: int
    """The last generation used (or found used) for this request id."""
    number: int = 0
    """Attempts made (counted ones)."""
    avoid: Counter[str] = dataclasses.field(default_factory=Counter)
    """This request's failures per worker: 1 per suspicion, 2 when certain."""
    tried: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """(P, D) pairs never to choose again."""
    unreachable: dict[str, int] = dataclasses.field(default_factory=dict)
    """Worker id -> epoch whose own call failed UNAVAILABLE in this request."""
    codes: list[StatusCode] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    requeues: int = 0
    behind_hops: int = 0
    wait_since: float | None = None
    """When the request began waiting for unreachable workers to be replaced (monotonic)."""
    wait_until: float | None = None
    """Until when it waits for them (set with `wait_since`)."""

    def dispatch(self, att: Attempt) -> None:
        """`att` is about to run: count it."""
        self.number += 1
        att.number = self.number
        self.generation = att.generation
        if att.route is Route.DISAGGREGATED:
            self.disaggregated_left -= 1
            self.tried.add((att.prefill.worker_id, att.decode.worker_id))

    def uncount(self, att: Attempt) -> None:
        """`att` ended without anybody failing: it does not count, its pair may be tried again."""
        self.number -= 1
        if att.route is Route.DISAGGREGATED:
            self.disaggregated_left += 1
            self.tried.discard((att.prefill.worker_id, att.decode.worker_id))

    def failed(self, att: Attempt, exc: AttemptFailed) -> None:
        """`att` failed: remember why and whom to avoid."""
        self.failures.append(f"{att.describe()}: {exc}")
        self.codes.append(exc.code)
        self.avoid.update(exc.suspects)
        if exc.culprit is not None:
            self.avoid[exc.culprit.worker_id] += 1
            if exc.code is StatusCode.UNAVAILABLE:
                self.unreachable[exc.culprit.worker_id] = exc.culprit.epoch

    def into_unreachable(self, att: Attempt) -> bool:
        """True when `att` would run on a worker (at the same epoch) that failed to answer."""
        return any(w is not None and self.unreachable.get(w.worker_id) == w.epoch
                   for w in (att.prefill, att.decode))

    def only_unreachable(self, cluster: ClusterSnapshot) -> bool:
        """True when this request saw a worker fail to answer and every decode-capable worker
        left is one of those (or none is left): waiting for K/V room there is waiting for
        nothing."""
        return bool(self.unreachable) and all(self.unreachable.get(w.worker_id) == w.epoch
                                              for w in cluster.workers if w.can_decode)

    def nobody_left(self, now: float) -> RouterError:
        """UNAVAILABLE naming the workers that failed to answer, once no other worker could
        take the request's next attempt within the wait for one (until `now`)."""
        waited_s = now - self.wait_since if self.wait_since is not None else 0.0
        return RouterError(StatusCode.UNAVAILABLE,
                           f"{', '.join(sorted(self.unreachable))} failed to answer and no other worker could take "
                           f"the request (waited {waited_s:.1f} s for one): {'; '.join(self.failures)}")

    def exhausted(self) -> RouterError:
        """The request's error once no attempt is left (or no worker can take it)."""
        if not self.failures:
            return RouterError(StatusCode.UNAVAILABLE, "no live worker can take this request")
        code = StatusCode.RESOURCE_EXHAUSTED if all(c is StatusCode.RESOURCE_EXHAUSTED for c in self.codes) \
            else StatusCode.UNAVAILABLE
        return RouterError(code, f"all {len(self.failures)} attempts failed: {'; '.join(self.failures)}")


class RetryPolicy:
    """The orchestrator's retry policy. A mixin of `Orchestrator`: it uses its `config`,
    `view`, `queue`, `planner`, `metrics`, `failures`, `generations`, `_clock`, `_release`,
    `_unbook`, `_remaining_s` and `_deadline_passed`."""

    async def _attempts(self, run: RequestRun) -> Completed:
        """The retry policy; returns the Complete event or raises RouterError."""
        req, cfg = run.req, self.config
        r = Retries(cfg.max_disaggregated_attempts if req.route is Route.DISAGGREGATED else 0,
                    self.generations.last(req), failures=run.failures)  # above any earlier run of this id
        fits = self.queue.room_for(req.demand)
        while r.number < cfg.max_attempts and not self._deadline_passed(run):
            cluster = await self.view.get()
            self._release(run)  # the plan-time hold must not count against the request's own room
            if not self.queue.go_now(req.tenant, fits, cluster) and not r.only_unreachable(cluster):
                await self._wait_for_room(run, fits)  # none comes on workers that failed to answer
                cluster = self.view.latest or cluster  # no await from here to the dispatch
            att = self._next_attempt(run, r, cluster, fits)
            if (att is None or r.into_unreachable(att)) and r.unreachable:
                # Only workers that failed to answer in this request (or none) are left: wait
                # for the cluster to change (a restart re-registers), then say whom it waited for
                # rather than dispatch into an address that did not answer (a frozen one hangs).
                if not self._wait_for_change(run, r):
                    raise r.nobody_left(time.monotonic())
                await asyncio.sleep(cfg.queue_poll_ms / 1000.0)
                continue
            if att is None:
                break
            att.first_index = self._resume_point(run)  # mid-stream: the prompt and the tokens given
            previous = run.runner.last
            if previous is None:  # the request's first dispatch: its wait since admission
                self.metrics.queued(req.tenant, len(req.prompt), self._clock() - run.start_s)
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
                    await self._requeue(run, r, att, exc)
                else:
                    self._failed(run, r, att, exc)
                continue
            finally:
                self.queue.kick()  # what the attempt held is free again
            return self._completed(run, r, att, done)
        raise self._deadline_passed(run) or r.exhausted()

    async def _wait_for_room(self, run: RequestRun, fits) -> None:
        """Wait in the admission queue for K/V room (router/requests/queueing.py); its
        RouterError (the queue full, the patience out) names the recent refusals too."""
        req = run.req
        try:
            self.view.overlay.remove(await self.queue.wait(
                req.tenant, req.request_id, fits, req.demand.blocks_on, self._patience_s(run),
                req.priority))
        except RouterError as exc:
            refused = f"; refused for room: {'; '.join(run.refusals[-2:])}" if run.refusals else ""
            raise RouterError(exc.code, exc.message + refused) from None

    async def _requeue(self, run: RequestRun, r: Retries, att: Attempt, exc: AttemptFailed) -> None:
        """`att` found no room after all (the snapshot lagged, or another router filled it): no
        one failed. The worker counts as full until it reports room; the request queues again."""
        r.requeues += 1
        run.refusals.append(f"{att.describe()}: {exc.message}")
        log.info("request %s: %s found no room (%s); back to the admission queue",
                 run.req.request_id, att.describe(), exc.message)
        self._unbook(run)
        if exc.culprit is not None:
            self.queue.fence_full(exc.culprit)
        else:
            await asyncio.sleep(min(0.05 * 2 ** r.requeues, 1.0))
        r.uncount(att)

    def _failed(self, run: RequestRun, r: Retries, att: Attempt, exc: AttemptFailed) -> None:
        """`att` failed: counted, its culprit remembered (here and router-wide); after tokens
        went out, the request migrates (router.migration)."""
        log.info("request %s: %s failed: %s", run.req.request_id, att.describe(), exc)
        self.metrics.attempt_failed(att.route.name.lower(), exc.code.name, att.discard_kv)
        if run.output.tokens:  # mid-stream: the request moves on
            self.metrics.migrated(exc.code.name)
            run.migrated_at = self._clock()
            run.trace.migrating(att.decode.worker_id, len(run.output.tokens), exc.code.name)
        self._unbook(run)  # a later attempt streams from elsewhere
        r.failed(att, exc)
        unanswered = exc.code in (StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED)
        if exc.stage == DIRECTORY_RESERVE and unanswered:
            self.view.directory_unreachable()
        if exc.culprit is not None and unanswered:
            self.failures.record(exc.culprit)

    def _completed(self, run: RequestRun, r: Retries, att: Attempt, done) -> Completed:
        """The request's Complete event from its last attempt's `done`; the planner and the
        metrics hear of it."""
        req = run.req
        completed = run.output.completed(done.finish_reason, att.route, r.number,  # the reply's, else the seal's
                                         att.prefill_kv_digest or att.sealed_kv_digest, done.kv_digest,
                                         "; ".join(run.failures))
        self.planner.completed(req.request_id, run.plan, completed, att.prefill, att.decode)
        slo = self.planner.slo(req.tenant, req.slo)
        self.metrics.completed(req.tenant, len(req.prompt), completed.ttft_ms / 1000, completed.tpot_ms / 1000,
                               completed.num_tokens, slo.ttft_ms / 1000, slo.tpot_ms / 1000, att.route.name.lower())
        self.metrics.finished(req.tenant, len(req.prompt), self._clock() - run.start_s)
        return completed

    def _next_attempt(self, run: RequestRun, r: Retries, cluster: ClusterSnapshot, fits) -> Attempt | None:
        """Attempt 1 as planned when its workers still can; otherwise placed now, avoiding
        what failed (a colocated worker that answers beats a pair with one that did not)."""
        first, g = r.number == 0, r.generation + 1
        penalties = r.avoid + Counter(self.failures.penalties(cluster)) + Counter(self.queue.fenced(cluster))
        att = run.planned_attempt(cluster, g) if first else None
        if att is not None and att.route is Route.DISAGGREGATED and self.view.colocated_only:
            att = None  # no transaction can run now (directory unreachable, or a rollback stopped routes)
        if att is not None and fits(ClusterSnapshot((att.decode,), cluster.route_epoch)) is None:
            att = None  # the planned D has no room (any more): place where there is
        att = att or self._place(cluster, run, g, first, r.disaggregated_left > 0 and not self.view.colocated_only,
                                 penalties, r.tried)
        if att is not None and att.route is Route.DISAGGREGATED and r.into_unreachable(att):
            colocated = self._place(cluster, run, g, False, False, penalties, r.tried)
            if colocated is not None and not r.into_unreachable(colocated):
                att = colocated
        return att

    def _resume_point(self, run: RequestRun) -> int:
        """Tokens given that the next attempt replays as prompt (0: it regenerates them)."""
        return run.output.resume_point() if self.config.resume_mid_stream else 0

    def _wait_for_change(self, run: RequestRun, r: Retries) -> bool:
        """True while the request may still wait (unreachable_wait_ms, within its patience)."""
        if r.wait_until is None:
            patience = self._patience_s(run)
            wait_s = self.config.unreachable_wait_ms / 1000.0
            r.wait_since = time.monotonic()
            r.wait_until = r.wait_since + (wait_s if patience is None else min(wait_s, patience))
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

    def _place(self, cluster: ClusterSnapshot, run: RequestRun, generation: int, first: bool, disaggregated: bool,
               avoid: Counter[str], tried: set[tuple[str, str]]) -> Attempt | None:
        """The next attempt's route, priced as attempt 1's (Planner.place); None: no worker can take it."""
        req = run.req.replaying(run.output.tokens[:self._resume_point(run)])  # priced as it will run
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
