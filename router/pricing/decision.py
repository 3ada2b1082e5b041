"""The per-request route decision: price candidates, gate on SLOs, score, choose.

Pure functions over cost rows (router/pricing/cost_model.py) and the request's shape;
no I/O, no clock. For one request of S prompt tokens (block size B, usable
prefix at most floor((S-1)/B) blocks: the last prompt token is always computed):

    disaggregated (P, D):
      compute set   = S - B*min(hit(P), usable)            tokens P computes
      transfer set  = ceil(S/B) - min(hit(D), usable)      blocks that move to D
      TTFT = queue(P) + prefill_P(compute set) [+ one step of P's decode batch per
             chunk, when P is a mixed worker that decodes too] + overhead(split)
             (token 0 leaves from P as soon as it is sampled)
      TPOT = D's step with batch+1 (rotated past max_batch)
             + (D's queued prefill + the hand-off: transfer(transfer-set bytes, P->D)
             + admission(D) + lag(split)) spread over the request's tokens (the
             decode streams after the hand-off: the client's first gap holds it)
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
They rank, never reject. In auto mode, colocated routes on decode workers are
left out while any split route is priced, but for short prompts (`by_role`).

Speed: pricing a P needs only P's row and the prefix hit, pricing a D only D's
row, so each side is cut to `top_k` by its cheap key; only the top_k x top_k
pairs (with the exact per-path transfer) and the top colocated workers are
priced and scored. The keys are evaluated over the snapshot's CostTable
(router/pricing/cost_table.py: columns built once per snapshot, one compiled pass per
key per request, the terms of router/pricing/formula.py), which prices the few
survivors as Rows (plain tuples, router/pricing/candidate.py; router/pricing/routes.py);
the scorers rate them as one ScoreBatch, and only the best of each route becomes a
Candidate (`choose_rows`). router/pricing/reference.py writes the same decision
plainly over Candidate objects (`reference_decide`): the oracle of
tests/unit/router/pricing/test_decision_table.py and the bench's baseline, imported by no
product module.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

from router.pricing.candidate import (
    COMPUTE,
    DECODE,
    DISTURB,
    FREE_AFTER,
    QUEUE,
    ROUTE,
    TPOT,
    TTFT,
    Candidate,
    Row,
    ScoreBatch,
    ScoreContext,
)
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


NO_WORKER = "no worker can take this request"
"""The reason of a REJECT with no priced route at all."""


def violations(c: Candidate, req: RequestShape) -> str:
    """Why `c` misses the request's targets ("" when it meets them)."""
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


def shortfall(ttft_ms: float, tpot_ms: float, req: RequestShape) -> float:
    """How far a route's predictions miss the request's targets, relative (for choosing the closest)."""
    over = 0.0
    if req.slo_ttft_ms > 0:
        over += max(0.0, ttft_ms / req.slo_ttft_ms - 1)
    if req.slo_tpot_ms > 0:
        over += max(0.0, tpot_ms / req.slo_tpot_ms - 1)
    return over


def rejected(closest: Candidate, best_dis: Candidate | None, best_col: Candidate | None,
             admissible: tuple[Candidate, ...]) -> Decision:
    """REJECT: no route meets the targets; the reason carries the closest route's numbers."""
    return Decision(Outcome.REJECT, None, best_dis, best_col,
                    f"no route meets the SLO; the closest, {closest.describe()}, misses it: "
                    f"{closest.violations} [{closest.breakdown()}]", admissible)


def late(c: Candidate, best_dis: Candidate | None, best_col: Candidate | None, note: str) -> Decision:
    """Take `c`, a calm route that misses only TTFT (router/pricing/interference.py, rule 3)."""
    outcome = Outcome.DISAGGREGATED if c.route is Route.DISAGGREGATED else Outcome.COLOCATED
    return Decision(outcome, c, best_dis, best_col, f"{c.describe()} misses only TTFT{note}")


def pick(best_dis: Candidate | None, best_col: Candidate | None, params: DecisionParams,
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


def by_role(rows: Sequence[Row], limit: int) -> tuple[Sequence[Row], str]:
    """`rows` less the colocated routes on decode workers (role DECODE: they cannot be a
    split's P) that compute more than `limit` prompt tokens, or whose worker has prefill
    queued, when any split route is priced; and a note saying so
    (`DecisionParams.decode_prefill_tokens`, auto mode).

    A deployment with prefill and decode pools keeps prefill work off its decode workers
    while a prefill worker can take it, but for a short prompt on a decode worker with
    nothing queued (it skips the hand-off and stalls the streams there by little). Every
    longer prefill at a decode worker stalls the streams there, and the prefill queued
    there delays every hand-off to it (its admission waits for the iteration), so the
    split routes of the next requests look late and more prompts go colocated to it.
    In the simulator a 7-prefill, 1-decode cluster fell from 99% to 61% attainment that
    way (docs/architecture.md, "Decode workers prefill only short prompts while a
    prefill worker can take the request"). Colocating on a decode worker stays the fallback for when no prefill worker
    can take the request; per-request colocation is what mixed workers are for."""
    if not any(r[ROUTE] is Route.DISAGGREGATED for r in rows):
        return rows, ""
    kept = [r for r in rows if r[ROUTE] is Route.DISAGGREGATED or r[DECODE].can_prefill
            or (r[COMPUTE] <= limit and r[QUEUE] <= 0)]
    if len(kept) == len(rows):
        return rows, ""
    return kept, left_out(len(rows) - len(kept))


def left_out(n: int) -> str:
    """The decision's note on `n` colocated routes `by_role` left out."""
    return f"; {n} colocated route(s) on decode workers left out (a prefill worker can take the request)"


def choose_rows(rows: Sequence[Row], req: RequestShape, params: DecisionParams) -> Decision:
    """Score the priced Rows as one batch, gate and choose (see the module docstring);
    Candidate objects are built only for the routes the Decision names."""
    note = ""
    if params.decode_prefill_tokens >= 0:
        rows, note = by_role(rows, params.decode_prefill_tokens)
    if not rows:
        return Decision(Outcome.REJECT, None, None, None, NO_WORKER)
    batch = ScoreBatch.of_rows(rows)
    scores = weighted_scores(batch, req, params.scorers)
    e = eligible(rows, req.slo_ttft_ms, req.slo_tpot_ms, req.max_tokens)
    if note:
        e = e._replace(note=e.note + note)
    if not e.at:
        return _reject(rows, scores, req)
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
        return late(_candidate(rows, scores, j, req), best[0], best[1], e.note)
    return pick(best[0], best[1], params, e.note, *ok)


def _reject(rows: Sequence[Row], scores: list[float], req: RequestShape) -> Decision:
    """No route meets the targets: REJECT with the closest route's numbers, the best of
    each route, and the routes auto mode may still admit (Decision.admissible: the best
    of each route among those whose prefill stalls no decode stream past the target, when
    any; else among those stalling the fewest streams decoding now)."""
    every = range(len(rows))
    dis, col = (_candidate(rows, scores, _best_at(rows, scores, r, every), req) for r in _ROUTES)
    closest = min(every, key=lambda i: (shortfall(rows[i][TTFT], rows[i][TPOT], req), rows[i][TTFT]))
    pool = [i for i in every if not harmful(rows[i][DISTURB], req.slo_tpot_ms)] or least_stalled(rows, every)
    admissible = (_candidate(rows, scores, _best_at(rows, scores, r, pool), req) for r in _ROUTES)
    return rejected(_candidate(rows, scores, closest, req), dis, col, tuple(c for c in admissible if c is not None))


def _candidate(rows: Sequence[Row], scores: list[float], i: int | None, req: RequestShape) -> Candidate | None:
    if i is None:
        return None
    c = Candidate(*rows[i], scores[i])
    c.violations = violations(c, req)
    return c


def _best_at(rows: Sequence[Row], scores: list[float], route: Route, among: Sequence[int]) -> int | None:
    """The index of the best of `route` among the indices `among`: among those that fit
    now (all of them when none does), the highest score, then the earliest first token."""
    pool = [i for i in among if rows[i][ROUTE] is route]
    fitting = [i for i in pool if rows[i][FREE_AFTER] >= 0] or pool
    if not fitting:
        return None
    keys = [(scores[i], -rows[i][TTFT]) for i in fitting]
    return fitting[keys.index(max(keys))]  # the first of equal keys, as max does


def decide(model: CostModel, rows: Sequence[WorkerCosts] | CostTable, req: RequestShape, params: DecisionParams,
           usable: Usable | None = None, split: bool = True, colocated: bool = True) -> Decision:
    """Price, prune, gate and choose for one request."""
    return choose_rows(priced_rows(model, rows, req, params.top_k, usable, split, colocated), req, params)


_ROUTES = (Route.DISAGGREGATED, Route.COLOCATED)


def finite(x: float) -> float:
    """x, or 0 when not finite (records and messages)."""
    return x if math.isfinite(x) else 0.0
