"""Round-number workers for the decision tests (tests/unit/router/pricing, and the
stream and interference tests that price with them).

Every profile uses round numbers so each prediction can be checked by hand:
prefill 1 ms per token, 1 MB K/V per block at 1000 MB/s (1 ms per block) plus
1 ms latency, decode steps of 10 ms per sequence, split overhead 5 ms,
colocated overhead 1 ms, hand-off lag 5 ms (a split route's decode streams transfer +
admission + 5 ms after its token 0: its TPOT holds that over its token gaps).
"""

from __future__ import annotations

from router.config import RouterConfig
from router.pricing.scorers import build
from router.pricing.shapes import DecisionParams
from runtime.directory.cost_profile import CostProfile
from runtime.directory.records import LoadReport, WorkerCapacity, WorkerRecord, WorkerRole

BS = 16
PROFILE = CostProfile(prefill_ms_per_token=1.0, decode_ms_per_seq=10.0, kv_bytes_per_block=1_000_000,
                      source="test")
CFG = RouterConfig(transfer_latency_ms=1.0, transfer_mb_per_s=1000.0, disaggregated_overhead_ms=5.0,
                   colocated_overhead_ms=1.0)


def worker(wid: str, role: WorkerRole, pending: int = 0, batch: int = 0, free: int = 1000,
           profile=PROFILE) -> WorkerRecord:
    return WorkerRecord(wid, role, f"{wid}:1", cache_abi_digest="abi", profile=profile,
                        capacity=WorkerCapacity(total_blocks=1000, max_decode_batch=64, max_prefill_tokens=256,
                                                block_size=BS),
                        load=LoadReport(pending_prefill_tokens=pending, active_decode_batch=batch, free_blocks=free,
                                        total_blocks=1000))


def params(**kw) -> DecisionParams:
    return DecisionParams(build(CFG.weights()), **kw)


def rows(model, *workers):
    return [model.costs(w) for w in workers]
