"""One route priced for one request, as a Row (router/pricing/candidate.py): the split
route P -> D and the colocated route on W, from the workers' cost rows
(router/pricing/worker_costs.py) and the terms of router/pricing/formula.py.

The decision prices its survivors with these (router/pricing/cost_table.py), and
the reference every route it keeps (router/pricing/reference.py). A worker's usable prefix hit is
min(hit, usable blocks) (router/pricing/shapes.py `RequestShape.usable_blocks`).
"""

from __future__ import annotations

import cython

from router.pricing.candidate import Candidate, Row
from router.pricing.cost_model import CostModel
from router.pricing.interference import colocated_disturb_ms, split_disturb_ms, stalled_streams
from router.pricing.shapes import RequestShape
from router.pricing.worker_costs import WorkerCosts
from router.types import Route

if cython.compiled:  # the terms as C calls (router/pricing/formula.pxd)
    from cython.cimports.router.pricing.formula import route_key
else:
    from router.pricing.formula import route_key


def usable_hit(req: RequestShape, worker_id: str) -> int:
    """Leading prompt blocks `worker_id` holds that the request can reuse."""
    return min(req.hits.get(worker_id, 0), req.usable_blocks)


PrefillSide = tuple[int, float, float, int]
"""What a split route's P contributes, the same for every D it pairs with: (compute: the
prompt tokens P computes, prefill: P's forward pass over them with the decode steps a
mixed P interleaves, disturb: the TPOT of P's own streams meanwhile (0 for a dedicated
P; router/pricing/interference.py), stalled: the streams at P it holds back). Plain
tuples here and in `colocated_times`: built per priced route, a NamedTuple's Python
__new__ cost more than the arithmetic."""


def prefill_side(p: WorkerCosts, req: RequestShape, hit: int) -> PrefillSide:
    """P's part of every split route from P, with `hit` usable prefix blocks at P."""
    reused = hit * req.block_size
    compute = req.prompt_tokens - reused
    own = p.prefill_ms(compute, reused)
    prefill = p.interleaved_ms(own, compute)
    end = p.queue_ms + prefill
    return compute, prefill, split_disturb_ms(p, own, req.max_tokens, end), \
        stalled_streams(p, end) if p.can_decode else 0


def pair_row(model: CostModel, p: WorkerCosts, d: WorkerCosts, req: RequestShape, overhead: float,
             side: PrefillSide, d_hit: int) -> Row:
    """The split route P -> D, P's part `side` (prefill_side), `d_hit` usable prefix blocks at D.
    Two clocks: token 0 leaves from P (TTFT: queue + prefill + `overhead`); D streams
    the rest after the hand-off (transfer + admission + the learned lag), which the
    request's TPOT holds over its gaps (router/pricing/cost_model.py)."""
    n, (compute, prefill, disturb, stalled) = req.prompt_tokens, side
    moved_blocks = req.prompt_blocks - d_hit
    nbytes = moved_blocks * (p.kv_bytes_per_block or d.kv_bytes_per_block)
    transfer = model.transfer_ms(p.worker.worker_id, d.worker.worker_id, nbytes)
    qm, adm = p.queue_ms, d.admission_ms
    handoff = transfer + adm + model.handoff_lag_ms() if req.max_tokens > 1 else 0.0  # one token: no gap
    return (Route.DISAGGREGATED, d.worker, p.worker, qm + prefill + overhead,
            d.tpot_with(n, req.max_tokens, handoff), qm, prefill, transfer, adm, overhead, n, compute,
            min(n, moved_blocks * req.block_size), nbytes, p.pending_tokens, d.free_blocks - req.need_blocks,
            d.worker.capacity.total_blocks, disturb, stalled, d.live + d.planned)


def colocated_times(w: WorkerCosts, req: RequestShape, hit: int) -> tuple[int, float, float, float, float]:
    """The colocated route on W with `hit` usable prefix blocks at W, before its fixed
    overhead: (compute: the prompt tokens W computes, own: W's forward pass over them
    alone, prefill: the same with the decode steps W interleaves, end: when it ends, ms
    from now, after W's queue; its TTFT is end + the overhead, tpot: the stream's cadence
    at W with the part of the prefill that overlaps W's streams). formula.colocated_keys
    computes the same for every W."""
    n = req.prompt_tokens
    reused = hit * req.block_size
    compute = n - reused
    own = w.prefill_ms(compute, reused)
    prefill = w.interleaved_ms(own, compute)
    end = w.queue_ms + prefill
    return compute, own, prefill, end, w.tpot_with(n, req.max_tokens, w.overlap_ms(own, end))


def colocated_key(w: WorkerCosts, req: RequestShape, overhead: float, hit: int, ttft_ref: float,
                  tpot_ref: float) -> float:
    """The colocated route's pruning key on W: its TTFT and TPOT, each over its reference."""
    _, _, _, end, tpot = colocated_times(w, req, hit)
    return route_key(end + overhead, tpot, ttft_ref, tpot_ref)


def colocated_row(w: WorkerCosts, req: RequestShape, overhead: float, hit: int) -> Row:
    """The colocated route on W with `hit` usable prefix blocks at W."""
    compute, own, prefill, end, tpot = colocated_times(w, req, hit)
    return (Route.COLOCATED, w.worker, None, end + overhead, tpot, w.queue_ms, prefill, 0.0, 0.0, overhead,
            req.prompt_tokens, compute, 0, 0, w.pending_tokens, w.free_blocks - req.need_blocks,
            w.worker.capacity.total_blocks, colocated_disturb_ms(w, own, req.max_tokens, end),
            stalled_streams(w, end), w.live + w.planned)


def price_pair(model: CostModel, p: WorkerCosts, d: WorkerCosts, req: RequestShape,
               overhead: float | None = None) -> Candidate:
    """The split route P -> D for `req`; `overhead`: the route's, when the caller already has it."""
    if overhead is None:
        overhead = model.overhead_ms(Route.DISAGGREGATED)
    side = prefill_side(p, req, usable_hit(req, p.worker.worker_id))
    return Candidate(*pair_row(model, p, d, req, overhead, side, usable_hit(req, d.worker.worker_id)))


def price_colocated(model: CostModel, w: WorkerCosts, req: RequestShape, overhead: float | None = None) -> Candidate:
    """The colocated route on W for `req`; `overhead`: the route's, when the caller already has it."""
    if overhead is None:
        overhead = model.overhead_ms(Route.COLOCATED)
    return Candidate(*colocated_row(w, req, overhead, usable_hit(req, w.worker.worker_id)))
