"""The reference decision: the router's route choice written plainly, one pass over
every row per request, from the same terms (router/pricing/formula.py) and route
builders (router/pricing/routes.py). It is the oracle the fast path
(router/pricing/cost_table.py over formula.py's column loops, compiled) must match bit for bit
(tests/unit/test_router_decision_table.py, test_router_native.py), and the bench's
same-run baseline (bench/router.py). Not on the serving path.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from router.pricing.candidate import Candidate
from router.pricing.cost_model import CostModel
from router.pricing.decision import choose
from router.pricing.formula import handoff_ms, route_key
from router.pricing.routes import colocated_key, price_colocated, price_pair, usable_hit
from router.pricing.shapes import Decision, DecisionParams, RequestShape, Usable
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
        overhead = model.overhead_ms(Route.DISAGGREGATED)
        pairs = []
        for p_ms, p in heapq.nsmallest(top_k, prefills, key=lambda x: x[0]):
            pid, abi = p.worker.worker_id, p.worker.cache_abi_digest
            for d_ms, tp, d in top_d.values():
                if d.worker.worker_id != pid and d.worker.cache_abi_digest == abi:
                    pairs.append((route_key(p_ms + d_ms + overhead, tp, ttft_ref, tpot_ref), p, d))
        for _, p, d in heapq.nsmallest(top_k, pairs, key=lambda x: x[0]):
            out.append(price_pair(model, p, d, req, overhead))
    if colocated:
        overhead = model.overhead_ms(Route.COLOCATED)
        cols = [(colocated_key(r, req, overhead, hit, ttft_ref, tpot_ref), r) for r, _, hit in decoders]
        out.extend(price_colocated(model, r, req, overhead)
                   for _, r in heapq.nsmallest(top_k, cols, key=lambda x: x[0]))
    return out
