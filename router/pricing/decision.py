"""The per-request route decision: price candidates, gate on SLOs, score, choose.

Pure functions over cost rows (router/pricing/cost_model.py) and the request's shape;
no I/O, no clock. For one request of S prompt tokens (block size B, usable
prefix at most floor((S-1)/B) blocks: the last prompt token is always computed):

    disaggregated (P, D):
      compute set   = S - B*min(hit(P), usable)            tokens P computes
      transfer set  = ceil(S/B) - min(hit(D), usable)      blocks that move to D
      TTFT = queue(P) + prefill_P(compute set) [+ one step of P's decode batch per
             chunk, when P is a mixed worker that decodes too] + transfer(transfer-set
             bytes, P->D) + admission(D) + overhead(split)
      TPOT = D's step with batch+1 (rotated past max_batch)
             + D's queued prefill spread over the request's tokens
    colocated W:
      TTFT = queue(W) + prefill_W(compute set) + one decode step of W's batch per
             prefill chunk (chunked prefill interleaves) + overhead(colocated)
      TPOT = W's step with batch+1 + (W's queued prefill + the part of this prompt's
             prefill that overlaps W's streams: all of it beside live ones, the part
             after the first planned one starts, router/requests/streams.py) spread over
             the request's tokens

A candidate is *feasible* when both predictions meet the request's targets
(0 = no target). Among feasible candidates (those whose reservation fits now
first), the weighted scorer sum picks the best split route and the best
colocated one; the split wins only by more than `margin`. No feasible
candidate -> REJECT, with the closest candidate's numbers, before any work.
Interference (router/pricing/interference.py, `eligible`): feasible candidates whose
prefill would hold the decode streams beside it past the TPOT target (a long
prompt colocated; a split whose P is a mixed worker with streams) are set aside
while any feasible candidate is not, and so are splits that would give a long
prompt's stream to the last stream-free mixed worker; when every feasible
candidate stalls streams decoding now, a calm one missing only TTFT is taken.
They rank, never reject.

Speed: pricing a P needs only P's row and the prefix hit, pricing a D only D's
row, so each side is cut to `top_k` by its cheap key; only the top_k x top_k
pairs (with the exact per-path transfer) and the top colocated workers are
priced and scored. The keys are evaluated over the snapshot's CostTable
(router/pricing/cost_table.py: columns built once per snapshot, one compiled pass per
key per request, the terms of router/pricing/formula.py), which prices the few
survivors as Rows (plain tuples, router/pricing/candidate.py; router/pricing/routes.py);
the scorers rate them as one ScoreBatch, and only the best of each route becomes a
Candidate (`choose_rows`). `reference_candidates` and
`choose` are the plain definitions they must match
(tests/unit/test_router_decision_table.py).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

from router.pricing.candidate import DISTURB, FREE_AFTER, ROUTE, TTFT, Candidate, Row, ScoreBatch, ScoreContext
from router.pricing.cost_model import CostModel
from router.pricing.cost_table import CostTable
from router.pricing.interference import eligible, harmful, least_stalled
from router.pricing.scorers.base import Scorer
from router.pricing.shapes import Decision, DecisionParams, Outcome, RequestShape, Usable
from router.pricing.worker_costs import WorkerCosts
from router.types import Route


def candidates(model: CostModel, rows: Sequence[WorkerCosts] | CostTable, req: RequestShape, top_k: int,
               usable: Usable | None = None, split: bool = True, colocated: bool = True) -> list[Candidate]:
    """Priced candidates: every worker's cheap keys from the snapshot's table
    (router/pricing/cost_table.py), and only the `top_k` best pairs and `top_k` best
    colocated workers (by TTFT and TPOT relative to their targets) are priced.
    Same result as `reference_candidates`."""
    return [Candidate(*r) for r in priced_rows(model, rows, req, top_k, usable, split, colocated)]


def priced_rows(model: CostModel, rows: Sequence[WorkerCosts] | CostTable, req: RequestShape, top_k: int,
                usable: Usable | None = None, split: bool = True, colocated: bool = True) -> list[Row]:
    """`candidates` as Rows (router/pricing/candidate.py), without building Candidate objects."""
    return CostTable.of(rows).price(model, req, top_k, usable, split, colocated)


def _violations(c: Candidate, req: RequestShape) -> str:
    parts = []
    if req.slo_ttft_ms > 0 and c.ttft_ms > req.slo_ttft_ms:
        parts.append(f"TTFT {c.ttft_ms:.1f} ms > SLO {req.slo_ttft_ms:g} ms")
    if req.slo_tpot_ms > 0 and c.tpot_ms > req.slo_tpot_ms:
        parts.append(f"TPOT {c.tpot_ms:.2f} ms > SLO {req.slo_tpot_ms:g} ms")
    return " and ".join(parts)


def weighted_scores(batch: ScoreBatch, req: RequestShape, scorers: Sequence[tuple[float, Scorer]]) -> list[float]:
    """Per candidate of `batch`, sum([weight * score for each scorer]), in the scorers' order."""
    ctx = ScoreContext(req.slo_ttft_ms, req.slo_tpot_ms, min(batch.ttft_ms), min(batch.tpot_ms))
    cols = [s.scores(batch, ctx) for _, s in scorers]
    assert all(map(len(batch).__eq__, map(len, cols))), "a scorer must rate every candidate"
    weights = [w for w, _ in scorers]
    return [sum(map(operator.mul, weights, xs)) for xs in zip(*cols)] if cols else [0.0] * len(batch)


def score_all(cands: Sequence[Candidate], req: RequestShape, scorers: Sequence[tuple[float, Scorer]]) -> None:
    """Fill `score` (weighted sum) and `violations` of every candidate."""
    for c, score in zip(cands, weighted_scores(ScoreBatch.of(cands), req, scorers)):
        c.violations = _violations(c, req)
        c.score = score


def _best(cands: Sequence[Candidate], route: Route) -> Candidate | None:
    pool = [c for c in cands if c.route is route]
    fitting = [c for c in pool if c.fits] or pool
    return max(fitting, key=lambda c: (c.score, -c.ttft_ms), default=None)


def _shortfall(c: Candidate, req: RequestShape) -> float:
    """How far a candidate misses its targets, relative (for choosing the closest)."""
    over = 0.0
    if req.slo_ttft_ms > 0:
        over += max(0.0, c.ttft_ms / req.slo_ttft_ms - 1)
    if req.slo_tpot_ms > 0:
        over += max(0.0, c.tpot_ms / req.slo_tpot_ms - 1)
    return over


def choose(cands: Sequence[Candidate], req: RequestShape, params: DecisionParams) -> Decision:
    """Score `cands` and decide (see the module docstring)."""
    if not cands:
        return Decision(Outcome.REJECT, None, None, None, "no worker can take this request")
    score_all(cands, req, params.scorers)
    e = eligible([c.row() for c in cands], req.slo_ttft_ms, req.slo_tpot_ms, req.max_tokens)
    feasible = [c for c in cands if not c.violations]
    pool = [cands[i] for i in e.at]
    pool_dis, pool_col = _best(pool, Route.DISAGGREGATED), _best(pool, Route.COLOCATED)
    best_dis = pool_dis or _best(feasible, Route.DISAGGREGATED) or _best(cands, Route.DISAGGREGATED)
    best_col = pool_col or _best(feasible, Route.COLOCATED) or _best(cands, Route.COLOCATED)
    if not feasible:
        closest = min(cands, key=lambda c: (_shortfall(c, req), c.ttft_ms))
        return Decision(Outcome.REJECT, None, best_dis, best_col,
                        f"no route meets the SLO; the closest, {closest.describe()}, misses it: "
                        f"{closest.violations} [TTFT = {closest.breakdown()}]", _admissible(cands, req))
    if e.late:
        return _late(min(pool, key=_earliest), best_dis, best_col, e.note)
    return _pick(best_dis, best_col, params, e.note, pool_dis is not None, pool_col is not None)


def _admissible(cands: Sequence[Candidate], req: RequestShape) -> tuple[Candidate, ...]:
    """Decision.admissible of a rejecting decision: a request admitted past its own
    prediction must not stall other streams when a route that does not exists."""
    rows = [c.row() for c in cands]
    calm = [i for i, r in enumerate(rows) if not harmful(r[DISTURB], req.slo_tpot_ms)]
    pool = [cands[i] for i in calm or least_stalled(rows, range(len(rows)))]
    return tuple(c for c in (_best(pool, Route.DISAGGREGATED), _best(pool, Route.COLOCATED)) if c is not None)


def _earliest(c: Candidate) -> tuple[bool, float]:
    """Among late routes: one that fits now, then the earliest first token."""
    return not c.fits, c.ttft_ms


def _late(c: Candidate, best_dis: Candidate | None, best_col: Candidate | None, note: str) -> Decision:
    outcome = Outcome.DISAGGREGATED if c.route is Route.DISAGGREGATED else Outcome.COLOCATED
    return Decision(outcome, c, best_dis, best_col, f"{c.describe()} misses only TTFT{note}")


def _pick(best_dis: Candidate | None, best_col: Candidate | None, params: DecisionParams,
          note: str = "", dis_ok: bool = True, col_ok: bool = True) -> Decision:
    """The feasible split beats the feasible colocated route only by more than the margin.
    `*_ok` False: that best was not drawn from the eligible pool (set aside for interference)."""
    dis = best_dis if dis_ok and best_dis is not None and not best_dis.violations else None
    col = best_col if col_ok and best_col is not None and not best_col.violations else None
    if dis is not None and (col is None or dis.score > col.score + params.margin):
        why = "no colocated route meets the SLO" if col is None else \
            f"split scores {dis.score:.3f} > colocated {col.score:.3f} + margin {params.margin:g}"
        return Decision(Outcome.DISAGGREGATED, dis, best_dis, best_col, why + note)
    why = "no split route meets the SLO" if dis is None else \
        f"colocated scores {col.score:.3f} >= split {dis.score:.3f} - margin {params.margin:g}"
    return Decision(Outcome.COLOCATED, col, best_dis, best_col, why + note)


def choose_rows(rows: Sequence[Row], req: RequestShape, params: DecisionParams) -> Decision:
    """`choose` over priced Rows: scored as one batch, and Candidate objects built
    only for the best of each route (a REJECT, rare, goes through `choose`)."""
    if not rows:
        return choose([], req, params)
    batch = ScoreBatch.of_rows(rows)
    scores = weighted_scores(batch, req, params.scorers)
    e = eligible(rows, req.slo_ttft_ms, req.slo_tpot_ms, req.max_tokens)
    if not e.at:
        return choose([Candidate(*r) for r in rows], req, params)
    best, ok = [], []
    for route in (Route.DISAGGREGATED, Route.COLOCATED):
        i = _best_at(rows, scores, route, e.at)
        ok.append(i is not None)
        if i is None:
            i = _best_at(rows, scores, route, e.feasible)
        if i is None:
            i = _best_at(rows, scores, route, range(len(rows)))
        best.append(_candidate(rows, scores, i, req))
    if e.late:
        j = min(e.at, key=lambda i: (rows[i][FREE_AFTER] < 0, rows[i][TTFT]))
        return _late(_candidate(rows, scores, j, req), best[0], best[1], e.note)
    return _pick(best[0], best[1], params, e.note, *ok)


def _candidate(rows: Sequence[Row], scores: list[float], i: int | None, req: RequestShape) -> Candidate | None:
    if i is None:
        return None
    c = Candidate(*rows[i], scores[i])
    c.violations = _violations(c, req)
    return c


def _best_at(rows: Sequence[Row], scores: list[float], route: Route, among: Sequence[int]) -> int | None:
    """`_best` over Rows: the index of the best of `route` among the indices `among`."""
    pool = [i for i in among if rows[i][ROUTE] is route]
    fitting = [i for i in pool if rows[i][FREE_AFTER] >= 0] or pool
    if not fitting:
        return None
    keys = [(scores[i], -rows[i][TTFT]) for i in fitting]
    return fitting[keys.index(max(keys))]  # max keeps the first of equal keys, as `_best`'s max does


def decide(model: CostModel, rows: Sequence[WorkerCosts] | CostTable, req: RequestShape, params: DecisionParams,
           usable: Usable | None = None, split: bool = True, colocated: bool = True) -> Decision:
    """Price, prune, gate and choose for one request."""
    return choose_rows(priced_rows(model, rows, req, params.top_k, usable, split, colocated), req, params)


def finite(x: float) -> float:
    """x, or 0 when not finite (records and messages)."""
    return x if math.isfinite(x) else 0.0
