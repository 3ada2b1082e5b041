"""Seeded random snapshots for the fast-decision tests (the decision table and the
router's compiled builds): workers mixing roles, ABIs, identical twins, prefix
hits, learned corrections and streams; requests and decision parameters to match."""

from __future__ import annotations

import dataclasses
import random

from router.config import RouterConfig
from router.pricing.cost_model import CostModel
from router.pricing.cost_table import CostTable
from router.pricing.scorers import build
from router.pricing.shapes import DecisionParams, RequestShape
from runtime.directory.cost_profile import CostProfile
from runtime.directory.records import LoadReport, WorkerCapacity, WorkerRecord, WorkerRole

CFG = RouterConfig()


def random_worker(rng: random.Random, i: int, block_size: int) -> WorkerRecord:
    role = rng.choice((WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.MIXED))
    profile = CostProfile(rng.choice((0.0, rng.uniform(0, 3))), rng.uniform(0.01, 0.2), rng.uniform(0, 1e-4),
                          rng.uniform(1, 5), rng.uniform(0.05, 0.5), rng.choice((0.0, 3e-5)),
                          rng.choice((0, 65536, 131072)), "calibrated")
    total = rng.choice((64, 4096))
    return WorkerRecord(f"w{i}", role, f"h{i}:1", cache_abi_digest=rng.choice(("abi", "abi", "other")), profile=profile,
                        capacity=WorkerCapacity(total_blocks=total, max_decode_batch=rng.choice((0, 8, 64)),
                                                max_prefill_tokens=rng.choice((0, 64, 256)), block_size=block_size),
                        load=LoadReport(pending_prefill_tokens=rng.choice((0, rng.randrange(0, 5000))),
                                        active_decode_batch=rng.choice((0, rng.randrange(0, 70))),
                                        free_blocks=rng.randrange(0, total + 1), total_blocks=total,
                                        active_context_tokens=rng.randrange(0, 50_000)))


def snapshot(rng: random.Random, block_size: int) -> list[WorkerRecord]:
    workers = [random_worker(rng, i, block_size) for i in range(rng.randrange(1, 40))]
    for _ in range(rng.randrange(0, 4)):  # identical twins under other ids: exact ties
        twin = rng.choice(workers)
        workers.insert(rng.randrange(len(workers) + 1),
                       dataclasses.replace(twin, worker_id=f"twin{len(workers)}"))
    return workers


def random_request(rng: random.Random, workers: list[WorkerRecord], block_size: int) -> RequestShape:
    n = rng.choice((0, 1, block_size, block_size + 1, rng.randrange(1, 3000), rng.randrange(1, 3000)))
    named = rng.sample(workers, rng.randrange(0, min(6, len(workers)) + 1))
    hits = {w.worker_id: rng.randrange(1, n // block_size + 3) for w in named}
    return RequestShape(n, rng.choice((1, 2, 16, 128, 1000)), block_size,
                        rng.choice((0.0, 0.0, rng.uniform(50, 5000))), rng.choice((0.0, 0.0, rng.uniform(5, 200))),
                        hits)


def learned_model(rng: random.Random, workers: list[WorkerRecord]) -> CostModel:
    model = CostModel(CFG)
    for _ in range(rng.randrange(0, 6)):
        a, b = rng.choice(workers), rng.choice(workers)
        model.observe_prefill(a, rng.randrange(1, 4000), 0, rng.uniform(1, 500))
        model.observe_transfer(a, b, rng.randrange(1, 1 << 26), rng.uniform(0.1, 50))
    return model


def random_streams(rng: random.Random) -> tuple[int, int, float] | None:
    """This router's streams at a worker (router/requests/streams.py), for about a third of them."""
    if rng.random() < 0.65:
        return None
    return rng.choice((0, 0, 1, 3)), rng.choice((0, 1, 2)), rng.choice((0.0, rng.uniform(0, 3000)))


def random_table(seed: int) -> tuple[random.Random, int, list[WorkerRecord], CostModel, CostTable]:
    """A seeded snapshot: the rng to draw its requests with, block size, workers, a
    model with learned corrections, and the table of its rows (a third carry streams)."""
    rng = random.Random(seed)
    block_size = rng.choice((16, 32))
    workers = snapshot(rng, block_size)
    model = learned_model(rng, workers)
    return rng, block_size, workers, model, CostTable([model.costs(w, streams=random_streams(rng)) for w in workers])


def random_params(rng: random.Random) -> DecisionParams:
    return DecisionParams(build(CFG.weights()), rng.choice((1, 2, 4, 8)), rng.choice((0.0, 0.05)),
                          rng.choice((-1, 0, 16, 256)))
