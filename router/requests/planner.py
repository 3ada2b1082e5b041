"""Router modes: turn a request and a snapshot into the first attempt's plan.

    disaggregated  the split route on the pair `choose_pair` ranks best (no SLO rejection)
    colocated      one worker, `choose_colocated` (no SLO rejection)
    auto           the per-request decision (router/pricing/decision.py): split, colocated
                   (on a decode worker only a short prompt, or when no split route exists:
                   `by_role`),
                   or reject with RESOURCE_EXHAUSTED before any work -- but only when
                   even the closest candidate misses a target by more than
                   `reject_slack`, on prices completions have confirmed (TPOT:
                   several agreeing recent streams at D; unless
                   `reject_unconfirmed`, or the miss survives /CLAMP), and never
                   on TPOT while D's recent streams ran well under the target
                   (see Planner._within_slack); otherwise that candidate runs: a wrongly
                   rejected request is worse than a late one, and only executed
                   requests correct the cost model
    shadow         the decision is computed and recorded (its best split route
                   too), the best colocated route executes; never rejects
    canary         `canary_fraction` of requests (by a hash of the request id, so a
                   retry of the same id lands the same way) take the best split
                   route, the rest the best colocated one; never rejects

Every mode records predicted TTFT/TPOT of the route it executes in the
DecisionLog, and the observed ones when the request completes; completions of
first attempts correct the cost model (router/pricing/cost_model.py). Retries after a
failed first attempt are priced the same way (`Planner.place`), within the route kind
the retry policy allows, away from the workers that failed.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable, Collection, Mapping

from router.config import RouterConfig
from router.pricing.candidate import DECODE, PREFILL_WORKER, ROUTE, Candidate
from router.pricing.cost_model import CLAMP, CostModel
from router.pricing.decision import choose_rows, decide, finite, priced_rows
from router.pricing.prefix_index import PrefixIndex, block_hashes
from router.pricing.routes import price_colocated, price_pair
from router.pricing.scorers import build
from router.pricing.shapes import Decision, DecisionParams, Outcome, RequestShape
from router.pricing.worker_costs import WorkerCosts
from router.requests.placement import Demand, LoadOverlay, choose_colocated, choose_pair, rejects
from router.requests.records import DecisionLog, DecisionRecord
from router.requests.streams import StreamBook
from router.types import Completed, PrefillDone, Route, Slo
from runtime.directory.records import ClusterSnapshot, WorkerRecord


@dataclasses.dataclass(slots=True)
class Plan:
    """The first attempt of a request, as its mode decided it."""

    mode: str
    outcome: Outcome
    route: Route
    prefill: WorkerRecord | None = None
    decode: WorkerRecord | None = None
    """None: let placement choose (nothing suitable was found at decision time)."""
    predicted: Candidate | None = None
    reason: str = ""
    hashes: list[int] = dataclasses.field(default_factory=list)
    """The prompt's block chain keys, recorded in the prefix index on completion."""
    own_tpot_ms: float = 0.0
    """The request's own predicted cadence: `predicted.tpot_ms` less, on a colocated
    route, its own prefill spread over its tokens (the dilation it causes W's
    *other* streams; its own decode starts after its prefill). Decode corrections
    compare observed TPOT with this, not with `predicted.tpot_ms`."""
    carried: tuple[float, float] = (1.0, 1.0)
    """(D's decode factor, W's prefill factor for the compute set) the prediction
    carried; corrections compose with these, not with later values."""
    arrival: int = 0
    """D's arrival count once this plan was made (Planner._arrivals): a completion
    whose D saw no later arrival is a clean decode sample."""


WELL_UNDER = 0.75
"""Auto mode never rejects on a TPOT prediction while D's recent streams ran at
most this share of the target (median observed TPOT)."""


def canary_pick(request_id: str, fraction: float) -> bool:
    """True for the `fraction` of request ids that go disaggregated (stable per id)."""
    return zlib.crc32(request_id.encode()) / 2**32 < fraction


class Planner:
    """Cost model, prefix index and decision log shared by every request."""

    def __init__(self, config: RouterConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.costs = CostModel(config, clock)
        self.streams = StreamBook(clock)
        """This router's planned and started streams (router/requests/streams.py): booked and
        dropped by the orchestrator, read into the cost rows."""
        self.prefix = PrefixIndex(config.prefix_index_blocks or 4096)
        self.log = DecisionLog(config.decision_log_size)
        self.params = DecisionParams(build(config.weights()), config.candidate_top_k, config.disaggregation_margin)
        self.auto_params = dataclasses.replace(self.params, decode_prefill_tokens=config.decode_prefill_tokens)
        """Auto mode's: prefill work at decode workers limited while a split route exists."""
        self.canary_fraction = config.canary_fraction
        self._arrivals: dict[str, int] = {}
        """Per decode worker: requests planned onto it (streams joining its batch,
        colocated prompts whose prefill interleaves with its streams)."""

    def slo(self, tenant: str, asked: Slo) -> Slo:
        """The request's targets: its own where set, else its tenant's defaults."""
        ttft, tpot = self.config.slo_for(tenant)
        return Slo(asked.ttft_ms or ttft, asked.tpot_ms or tpot)

    def rows(self, cluster: ClusterSnapshot, overlay: LoadOverlay | None) -> list[WorkerCosts]:
        """Cost rows of every worker, with this router's unreported dispatches folded in."""
        extra = overlay.totals() if overlay is not None else {}
        streams = self.streams.at({w.worker_id: w.epoch for w in cluster.workers}) if len(self.streams) else {}
        rows = []
        for w in cluster.workers:
            self.prefix.sync(w.worker_id, w.epoch, self.config.prefix_index_blocks or w.capacity.total_blocks)
            tokens, blocks, seqs = extra.get(w.worker_id, (0, 0, 0))
            rows.append(self.costs.costs(w, tokens, blocks, seqs, streams.get(w.worker_id)))
        return rows

    def plan(self, request_id: str, tenant: str, prompt: tuple[int, ...], max_tokens: int, mode: str, slo: Slo,
             cluster: ClusterSnapshot, overlay: LoadOverlay | None = None,
             avoid: Mapping[str, int] | None = None) -> Plan:
        """Decide the first attempt under `mode` and record the prediction."""
        t0 = time.perf_counter()
        avoid = avoid or {}
        req, hashes = self._shape(tenant, prompt, max_tokens, slo, cluster)
        rows = self.rows(cluster, overlay)
        demand = Demand(len(prompt), max_tokens, max(prompt))
        if mode in ("disaggregated", "colocated"):
            plan = self._forced(mode, rows, req, demand, cluster, overlay, avoid)
            decision = None
        else:
            fit = lambda r: rejects(r.worker, demand) is None  # noqa: E731
            params = self.auto_params if mode == "auto" else self.params
            decision = None
            if avoid:  # recently failed workers only when nothing else can serve
                decision = decide(self.costs, rows, req, params,
                                  lambda r: avoid.get(r.worker.worker_id, 0) == 0 and fit(r))
            if decision is None or not (decision.best_colocated or decision.best_disaggregated):
                decision = decide(self.costs, rows, req, params, fit)
            plan = self._by_mode(mode, request_id, decision, req)
        plan.hashes = hashes
        if plan.predicted is not None:
            c = plan.predicted
            row = next((r for r in rows if r.worker is c.decode), None)
            plan.own_tpot_ms = own_tpot_ms(row, c, req) if row else c.tpot_ms
            plan.carried = (self.costs.decode_factor(c.decode.worker_id),
                            self.costs.prefill_factor(c.decode.worker_id, c.compute_tokens))
            d = c.decode.worker_id
            self._arrivals[d] = plan.arrival = self._arrivals.get(d, 0) + 1
        self._record(request_id, tenant, plan, decision, req, (time.perf_counter() - t0) * 1e6)
        return plan

    def place(self, tenant: str, prompt: tuple[int, ...], max_tokens: int, slo: Slo, cluster: ClusterSnapshot,
              overlay: LoadOverlay | None, split: bool, avoid: Mapping[str, int],
              tried: Collection[tuple[str, str]] = ()) -> Candidate | None:
        """A retry's route (router/requests/orchestrator.py), priced and chosen as a first
        attempt's (`decide`), within one route kind: the best split route when `split`, else
        the best colocated one; None when no worker can take the request.

        Left out: workers that can never take it (`rejects`) and the `tried` (P, D) pairs.
        Workers to avoid (this request's failures, recent router-wide ones, workers fenced
        full: `avoid`, a penalty each) are priced only when no route avoids them: first the
        routes whose workers all have penalty 0, then those whose workers' largest penalty
        is the next one up, and so on. Never a rejection: a retry of an admitted request
        takes the best route of its kind even when it misses the targets."""
        req = self._shape(tenant, prompt, max_tokens, slo, cluster)[0]
        rows = self.rows(cluster, overlay)
        demand = Demand(len(prompt), max_tokens, max(prompt))
        top_k = self.params.top_k + len(tried)  # the tried pairs among them still leave top_k others
        for level in sorted({0, *avoid.values()}):
            usable = lambda r, t=level: avoid.get(r.worker.worker_id, 0) <= t and rejects(r.worker, demand) is None  # noqa: E731
            priced = [r for r in priced_rows(self.costs, rows, req, top_k, usable, split, not split)
                      if r[ROUTE] is Route.COLOCATED or (r[PREFILL_WORKER].worker_id, r[DECODE].worker_id) not in tried]
            if priced:
                d = choose_rows(priced, req, self.params)
                return d.chosen or (d.best_disaggregated if split else d.best_colocated)
        return None

    def _shape(self, tenant: str, prompt: tuple[int, ...], max_tokens: int, slo: Slo,
               cluster: ClusterSnapshot) -> tuple[RequestShape, list[int]]:
        """The request's shape for pricing (its prefix hits included), and its block chain keys."""
        block_size = next((w.capacity.block_size for w in cluster.workers if w.capacity.block_size), 16)
        hashes = block_hashes(prompt, block_size, tenant)
        return RequestShape(len(prompt), max_tokens, block_size, slo.ttft_ms, slo.tpot_ms,
                            self.prefix.match(hashes) if hashes else {}), hashes

    def _forced(self, mode: str, rows: list[WorkerCosts], req: RequestShape, demand: Demand, cluster: ClusterSnapshot,
                overlay: LoadOverlay | None, avoid: Mapping[str, int]) -> Plan:
        by_id = {r.worker.worker_id: r for r in rows}
        if mode == "disaggregated":
            pair = choose_pair(cluster, demand, overlay, avoid)
            if pair is not None:
                c = price_pair(self.costs, by_id[pair[0].worker_id], by_id[pair[1].worker_id], req)
                return Plan(mode, Outcome.DISAGGREGATED, Route.DISAGGREGATED, pair[0], pair[1], c, "forced split")
        w = choose_colocated(cluster, demand, overlay, avoid)
        if w is None:
            return Plan(mode, Outcome.COLOCATED, Route.COLOCATED, reason="no worker fits now")
        c = price_colocated(self.costs, by_id[w.worker_id], req)
        why = "forced colocated" if mode == "colocated" else "no split pair; colocated fallback"
        return Plan(mode, Outcome.COLOCATED, Route.COLOCATED, None, w, c, why)

    def _by_mode(self, mode: str, request_id: str, d: Decision, req: RequestShape) -> Plan:
        if mode == "auto":
            if d.outcome is Outcome.REJECT:
                closest = self._within_slack(d, req)
                if closest is None:
                    return Plan(mode, Outcome.REJECT, Route.COLOCATED, reason=d.reason)
                return self._execute(mode, closest, f"admitted within the rejection slack: {d.reason}")
            return self._execute(mode, d.chosen, d.reason)
        if mode == "canary" and canary_pick(request_id, self.canary_fraction) and d.best_disaggregated:
            return self._execute(mode, d.best_disaggregated, f"canary share {self.canary_fraction:g}")
        why = "shadow: executes colocated" if mode == "shadow" else "canary: colocated share"
        return self._execute(mode, d.best_colocated, why)

    def _within_slack(self, d: Decision, req: RequestShape) -> Candidate | None:
        """The closest of a rejecting decision's admissible candidates (those that
        stall no decode stream past the target when any: `Decision.admissible`)
        unless its rejection stands (then None). It stands only when some target is missed beyond
        `reject_slack` on a price that is trusted for it:

        * the price is confirmed (TTFT: the computing worker's prefill corrected
          by a completion; TPOT: D's decode confirmed by several agreeing recent
          streams, `CostModel.decode_confirmed`), or `reject_unconfirmed`, or
          the miss survives even the largest correction (the prediction divided
          by CLAMP still misses: no calibration error explains it);
        * and, for TPOT, D's recent streams did not run well under the target
          (median observed TPOT above WELL_UNDER x target): a prediction that
          contradicts what D is measured doing is the model's error, not D's."""
        pool = list(d.admissible) or [c for c in (d.best_disaggregated, d.best_colocated) if c is not None]
        if not pool:
            return None
        c = min(pool, key=lambda c: (not c.fits, miss(c, req)))
        slack = self.config.reject_slack
        if miss(c, req) <= slack:
            return c
        bound = 1 + slack
        ttft_out = req.slo_ttft_ms > 0 and c.ttft_ms > bound * req.slo_ttft_ms
        tpot_out = req.slo_tpot_ms > 0 and c.tpot_ms > bound * req.slo_tpot_ms
        loose = self.config.reject_unconfirmed
        if ttft_out and (loose or self.costs.prefill_confirmed(c) or c.ttft_ms / CLAMP > bound * req.slo_ttft_ms):
            return None
        if tpot_out:
            seen = self.costs.observed_tpot_ms(c.decode.worker_id)
            contradicted = seen is not None and seen <= WELL_UNDER * req.slo_tpot_ms
            trusted = loose or self.costs.confirmed(c) or c.tpot_ms / CLAMP > bound * req.slo_tpot_ms
            if trusted and not contradicted:
                return None
        return c

    @staticmethod
    def _execute(mode: str, c: Candidate | None, why: str) -> Plan:
        if c is None:
            return Plan(mode, Outcome.COLOCATED, Route.COLOCATED, reason=f"{why}; no candidate, placement decides")
        outcome = Outcome.DISAGGREGATED if c.route is Route.DISAGGREGATED else Outcome.COLOCATED
        return Plan(mode, outcome, c.route, c.prefill, c.decode, c, why)

    def _record(self, request_id: str, tenant: str, plan: Plan, d: Decision | None, req: RequestShape,
                decision_us: float) -> None:
        c, s = plan.predicted, d.best_disaggregated if d is not None else None
        self.log.add(DecisionRecord(
            request_id, tenant, plan.mode, plan.outcome.value,
            prefill_worker_id=plan.prefill.worker_id if plan.prefill else "",
            decode_worker_id=plan.decode.worker_id if plan.decode else "",
            predicted_ttft_ms=finite(c.ttft_ms) if c else 0.0, predicted_tpot_ms=finite(c.tpot_ms) if c else 0.0,
            slo_ttft_ms=req.slo_ttft_ms, slo_tpot_ms=req.slo_tpot_ms,
            shadow_prefill_worker_id=s.prefill.worker_id if s else "",
            shadow_decode_worker_id=s.decode.worker_id if s else "",
            shadow_predicted_ttft_ms=finite(s.ttft_ms) if s else 0.0,
            shadow_predicted_tpot_ms=finite(s.tpot_ms) if s else 0.0,
            prompt_tokens=req.prompt_tokens, compute_tokens=c.compute_tokens if c else 0,
            transfer_tokens=c.transfer_tokens if c else 0, decision_us=decision_us, reason=plan.reason,
            finished=plan.outcome is Outcome.REJECT))

    # ---- feedback -----------------------------------------------------------
    def prefill_done(self, plan: Plan | None, prefill: WorkerRecord, decode: WorkerRecord, done: PrefillDone) -> None:
        """Correct prefill and transfer costs from PrefillResult's timings."""
        if done.compute_ms > 0 and done.computed_tokens > 0:
            self.costs.observe_prefill(prefill, done.computed_tokens, done.reused_tokens, done.compute_ms)
        if done.sent_bytes > 0 and done.transfer_ms > 0:
            self.costs.observe_transfer(prefill, decode, done.sent_bytes, done.transfer_ms)

    def completed(self, request_id: str, plan: Plan | None, done: Completed, prefill: WorkerRecord | None,
                  decode: WorkerRecord) -> None:
        """Record observed times; a first attempt on the planned route also corrects
        the decode cost and the route overhead, and teaches the prefix index."""
        self.log.observe(request_id, done.ttft_ms, done.tpot_ms, done.route.name.lower(),
                         prefill.worker_id if prefill else "", decode.worker_id)
        if plan is None:
            return
        for w in (prefill, decode):
            if w is not None:
                self.prefix.record(w.worker_id, plan.hashes)
        c = plan.predicted
        if c is None or done.attempts != 1 or done.route is not c.route or decode.worker_id != c.decode.worker_id:
            return
        # Two clocks on a split route (router/pricing/cost_model.py): the client's token 0 (the
        # prefill's) teaches the route's overhead, the decode's token 0 after it the hand-off's
        # lag, and the decode's own cadence from there its step price (own_tpot_ms: no lag in it).
        if done.num_tokens > 1 and done.decoding_tpot_ms > 0:
            clean = self._arrivals.get(decode.worker_id, 0) == plan.arrival
            self.costs.observe_tpot(decode, plan.own_tpot_ms or c.tpot_ms, done.decoding_tpot_ms, plan.carried[0],
                                    clean)
        self.costs.observe_first_token(c, done.ttft_ms, plan.carried[1])
        if done.decode_ttft_ms is not None:
            self.costs.observe_handoff(c, done.decode_ttft_ms - done.ttft_ms)


def own_tpot_ms(row: WorkerCosts, c: Candidate, req: RequestShape) -> float:
    """The request's own predicted cadence at D: its step with D's batch + 1, plus
    D's queued prefill spread over its tokens on a split route (those prompts
    interleave with its decode). Not on a colocated route: W's queued prompts and
    its own prefill run before its first token, so they dilate W's *other*
    streams (`c.tpot_ms`), not this one."""
    own = row.tpot_with(req.prompt_tokens, req.max_tokens)
    if c.route is Route.COLOCATED:
        own -= row.queue_ms / max(1, req.max_tokens - 1)
    return own


def miss(c: Candidate, req: RequestShape) -> float:
    """By how much `c`'s predictions exceed the request's targets, relative:
    max over the set targets of predicted / target - 1 (<= 0: meets them)."""
    over = [c.ttft_ms / req.slo_ttft_ms - 1 if req.slo_ttft_ms > 0 else -1.0,
            c.tpot_ms / req.slo_tpot_ms - 1 if req.slo_tpot_ms > 0 else -1.0]
    return max(over)
