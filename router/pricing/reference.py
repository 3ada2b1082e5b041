"""The reference decision: the router's route choice written plainly, one pass over
every row per request. It is the oracle the fast path (router/pricing/cost_table.py and
router/pricing/table_kernel.py, compiled) must match bit for bit
(tests/unit/router/pricing/test_decision_table.py, tests/unit/router/test_native.py), and the bench's
same-run baseline (bench/router.py). Not on the serving path.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from router.pricing.candidate import Candidate
from router.pricing.cost_model import CostModel
from router.pricing.decision import choose, price_colocated, price_pair, route_key
from router.pricing.shapes import Decision, DecisionParams, RequestShape, Usable
from router.pricing.worker_costs import WorkerCosts
from router.types import Route


def reference_decide(model: CostModel, rows: Sequence[WorkerCosts], req: RequestShape, params: DecisionParams,
                     usable: Usable | None = None, split: bool = True, colocated: bool = True) -> Decision:
    """`decide` over `reference_candidates` (tests and the bench's baseline)."""
    return choose(reference_candidates(model, rows, req, params.top_k, usable, split, colocated), req, params)


def reference_candidates(model: CostModel, rows: Sequence[WorkerCosts], req: RequestShape, top_k: int,
               usable: Usable | None = None, split: bool = True, colocated: bool = True) -> list[Candidate]:
    """`candidates` written plainly: one pass over every row per request. The
    definition the fast path (router/pricing/cost_table.py) must match, kept for tests
    and the bench's same-run baseline."""
    hits, bs, usable_blocks, n, m = req.hits, req.block_size, req.usable_blocks, req.prompt_tokens, req.max_tokens
    gaps = max(1, m - 1)
    ctx_add = n + m // 2
    decoders = []  # (row, tpot with this request, usable hit blocks)
    prefills = []  # (queue + prefill of the compute set, row, reused tokens)
    for r in rows:
        if usable is not None and not usable(r):
            continue
        hit = hits.get(r.worker.worker_id, 0) if hits else 0
        if hit > usable_blocks:
            hit = usable_blocks
        if r.can_decode:  # tpot_with, inlined
            decoders.append((r, r.tpot_base + r.tpot_per_token * ctx_add + r.queue_ms / gaps, hit))
        if split and r.can_prefill:
            new = n - hit * bs
            prefills.append((r.queue_ms + r.pre_base + r.pre_tok * new + r.pre_pair * new * (n - new / 2.0),
                             r, hit * bs))
    if not decoders:
        return []
    ttft_ref = req.slo_ttft_ms or max(1.0, min(p[0] for p in prefills) if prefills else 1.0)
    tpot_ref = req.slo_tpot_ms or max(1e-3, min(d[1] for d in decoders))
    out: list[Candidate] = []
    if split and prefills:
        ms_per_byte = model.transfer_ms("", "", 1 << 20) / (1 << 20)  # all-paths factor: a cheap bound
        blocks = req.prompt_blocks
        d_side = [(r.admission_ms + (blocks - hit) * r.kv_bytes_per_block * ms_per_byte, tp, r)
                  for r, tp, hit in decoders]
        top_d = {id(x[2]): x for x in heapq.nsmallest(top_k, d_side, key=lambda x: x[0])
                 + heapq.nsmallest(top_k, d_side, key=lambda x: x[1])}
        overhead = model.overhead_ms(Route.DISAGGREGATED)
        pairs = []
        for p_ms, p, _ in heapq.nsmallest(top_k, prefills, key=lambda x: x[0]):
            pid, abi = p.worker.worker_id, p.worker.cache_abi_digest
            for d_ms, tp, d in top_d.values():
                if d.worker.worker_id != pid and d.worker.cache_abi_digest == abi:
                    pairs.append((route_key(p_ms + d_ms + overhead, tp, ttft_ref, tpot_ref), p, d))
        for _, p, d in heapq.nsmallest(top_k, pairs, key=lambda x: x[0]):
            out.append(price_pair(model, p, d, req))
    if colocated:
        overhead = model.overhead_ms(Route.COLOCATED)
        cols = [(r.colocated_key(n, hit * bs, tp, gaps, overhead, ttft_ref, tpot_ref), r) for r, tp, hit in decoders]
        out.extend(price_colocated(model, r, req) for _, r in heapq.nsmallest(top_k, cols, key=lambda x: x[0]))
    return out
