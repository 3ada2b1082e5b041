"""The reference decision: the router's route choice written plainly, one pass over
every row per request, from the same terms (router/pricing/formula.py) and route
builders (router/pricing/routes.py). It is the oracle the fast path
(router/pricing/cost_table.py over formula.py's column loops, compiled) must match bit for bit
(tests/unit/router/pricing/test_decision_table.py, tests/unit/router/test_native.py), and the bench's
same-run baseline (bench/router.py). Not on the serving path.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from router.pricing.candidate import DISTURB, Candidate, ScoreBatch
from router.pricing.cost_model import CostModel
from router.pricing.decision import NO_WORKER, late, left_out, pick, rejected, shortfall, violations, weighted_scores
from router.pricing.formula import handoff_ms, route_key
from router.pricing.interference import eligible, harmful, least_stalled
from router.pricing.routes import colocated_key, price_colocated, price_pair, usable_hit
from router.pricing.scorers.base import Scorer
from router.pricing.shapes import Decision, DecisionParams, Outcome, RequestShape, Usable
from router.pricing.worker_costs import WorkerCosts
from router.types import Route


def reference_decide(model: CostModel, rows: Sequence[WorkerCosts], req: RequestShape, params: DecisionParams,
                     usable: Usable | None = None, split: bool = True, colocated: bool = True) -> Decision:
    """`decide` over `reference_candidates` (tests and the bench's baseline)."""
    return choose(reference_candidates(model, rows, req, params.top_k, usable, split, colocated), req, params)


def reference_candidates(model: CostModel, rows: Sequence[WorkerCosts], req: RequestShape, top_k: int,
                         usable: Usable | None = None, split: bool = True, colocated: bool = True) -> list[Candidate]:
    """`candidates` written plainly: one pass over every row per request, each key from
    the rows' own terms (router/pricing/formula.py through WorkerCosts and
    router/pricing/routes.py). The definition the fast path (router/pricing/cost_table.py)
    must match, kept for tests and the bench's same-run baseline."""
    n, m, bs = req.prompt_tokens, req.max_tokens, req.block_size
    decoders = []  # (row, tpot with this request, usable hit blocks)
    prefills = []  # (queue + prefill bound of the compute set, row)
    for r in rows:
        if usable is not None and not usable(r):
            continue
        hit = usable_hit(req, r.worker.worker_id)
        if r.can_decode:
            decoders.append((r, r.tpot_with(n, m), hit))
        if split and r.can_prefill:
            prefills.append((r.queued_prefill_ms(n - hit * bs, hit * bs), r))
    if not decoders:
        return []
    ttft_ref = req.slo_ttft_ms or max(1.0, min(p[0] for p in prefills) if prefills else 1.0)
    tpot_ref = req.slo_tpot_ms or max(1e-3, min(d[1] for d in decoders))
    out: list[Candidate] = []
    if split and prefills:
        ms_per_byte = model.transfer_ms("", "", 1 << 20) / (1 << 20)  # all-paths factor: a cheap bound
        blocks = req.prompt_blocks
        d_side = [(handoff_ms(r.admission_ms, blocks - hit, r.kv_bytes_per_block, ms_per_byte), tp, r)
                  for r, tp, hit in decoders]
        top_d = {id(x[2]): x for x in heapq.nsmallest(top_k, d_side, key=lambda x: x[0])
                 + heapq.nsmallest(top_k, d_side, key=lambda x: x[1])}
        overhead, lag = model.overhead_ms(Route.DISAGGREGATED), model.handoff_lag_ms()
        spread = 1.0 / (m - 1) if m > 1 else 0.0  # the hand-off in the token gaps (none: one token)
        pairs = []
        for p_ms, p in heapq.nsmallest(top_k, prefills, key=lambda x: x[0]):
            pid, abi = p.worker.worker_id, p.worker.cache_abi_digest
            for d_ms, tp, d in top_d.values():
                if d.worker.worker_id != pid and d.worker.cache_abi_digest == abi:
                    pairs.append((route_key(p_ms + overhead, tp + (d_ms + lag) * spread, ttft_ref, tpot_ref), p, d))
        for _, p, d in heapq.nsmallest(top_k, pairs, key=lambda x: x[0]):
            out.append(price_pair(model, p, d, req, overhead))
    if colocated:
        overhead = model.overhead_ms(Route.COLOCATED)
        cols = [(colocated_key(r, req, overhead, hit, ttft_ref, tpot_ref), r) for r, _, hit in decoders]
        out.extend(price_colocated(model, r, req, overhead)
                   for _, r in heapq.nsmallest(top_k, cols, key=lambda x: x[0]))
    return out


def choose(cands: Sequence[Candidate], req: RequestShape, params: DecisionParams) -> Decision:
    """`choose_rows` (router/pricing/decision.py) written over Candidate objects: score
    them all, gate on the targets and interference, choose."""
    note = ""
    limit = params.decode_prefill_tokens
    if limit >= 0 and any(c.route is Route.DISAGGREGATED for c in cands):
        kept = [c for c in cands if c.route is Route.DISAGGREGATED or c.decode.can_prefill
                or (c.compute_tokens <= limit and c.queue_tokens <= 0)]
        if len(kept) < len(cands):
            note = left_out(len(cands) - len(kept))
        cands = kept
    if not cands:
        return Decision(Outcome.REJECT, None, None, None, NO_WORKER)
    score_all(cands, req, params.scorers)
    e = eligible([c.row() for c in cands], req.slo_ttft_ms, req.slo_tpot_ms, req.max_tokens)
    e = e._replace(note=e.note + note)
    feasible = [c for c in cands if not c.violations]
    pool = [cands[i] for i in e.at]
    pool_dis, pool_col = _best(pool, Route.DISAGGREGATED), _best(pool, Route.COLOCATED)
    best_dis = pool_dis or _best(feasible, Route.DISAGGREGATED) or _best(cands, Route.DISAGGREGATED)
    best_col = pool_col or _best(feasible, Route.COLOCATED) or _best(cands, Route.COLOCATED)
    if not feasible:
        closest = min(cands, key=lambda c: (shortfall(c.ttft_ms, c.tpot_ms, req), c.ttft_ms))
        return rejected(closest, best_dis, best_col, _admissible(cands, req))
    if e.late:
        return late(min(pool, key=lambda c: (not c.fits, c.ttft_ms)), best_dis, best_col, e.note)
    return pick(best_dis, best_col, params, e.note, pool_dis is not None, pool_col is not None)


def score_all(cands: Sequence[Candidate], req: RequestShape, scorers: Sequence[tuple[float, Scorer]]) -> None:
    """Fill `score` (weighted sum) and `violations` of every candidate."""
    for c, score in zip(cands, weighted_scores(ScoreBatch.of(cands), req, scorers)):
        c.violations = violations(c, req)
        c.score = score


def _best(cands: Sequence[Candidate], route: Route) -> Candidate | None:
    pool = [c for c in cands if c.route is route]
    fitting = [c for c in pool if c.fits] or pool
    return max(fitting, key=lambda c: (c.score, -c.ttft_ms), default=None)


def _admissible(cands: Sequence[Candidate], req: RequestShape) -> tuple[Candidate, ...]:
    """Decision.admissible of a rejecting decision."""
    rows = [c.row() for c in cands]
    calm = [i for i, r in enumerate(rows) if not harmful(r[DISTURB], req.slo_tpot_ms)]
    pool = [cands[i] for i in calm or least_stalled(rows, range(len(rows)))]
    return tuple(c for c in (_best(pool, Route.DISAGGREGATED), _best(pool, Route.COLOCATED)) if c is not None)
