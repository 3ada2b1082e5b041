"""The fast decision (router/pricing/cost_table.py) against the plain one, on random snapshots.

`decide` must return what `reference_decide` (one pass over every row per
request) returns: the same candidates in the same order, hence the same choice,
predictions and reason. Snapshots mix roles, ABIs, identical twins (exact ties),
prefix hits (some past the usable prefix), SLOs or none, usable filters, the
split/colocated switches and learned corrections.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from router.pricing.cost_model import CostModel
from router.pricing.cost_table import CostTable
from router.pricing.decision import candidates, decide
from router.pricing.reference import reference_candidates, reference_decide
from router.pricing.scorers import build
from router.pricing.shapes import DecisionParams, Outcome
from runtime.directory.records import WorkerRole
from tests.support.random_tables import (
    CFG,
    learned_model,
    random_params,
    random_request,
    random_streams,
    random_table,
    snapshot,
)


@pytest.mark.parametrize("seed", range(80))
def test_fast_decision_equals_reference(seed):
    rng, block_size, workers, model, rows = random_table(seed)
    for _ in range(25):
        req = random_request(rng, workers, block_size)
        params = random_params(rng)
        banned = {w.worker_id for w in workers if rng.random() < 0.2}
        usable = rng.choice((None, lambda r: r.worker.worker_id not in banned))
        split, colocated = rng.choice(((True, True), (True, False), (False, True)))
        want = reference_candidates(model, rows.rows, req, params.top_k, usable, split, colocated)
        assert candidates(model, rows, req, params.top_k, usable, split, colocated) == want
        got, ref = (decide(model, rows, req, params, usable, split, colocated),
                    reference_decide(model, rows.rows, req, params, usable, split, colocated))
        assert got == ref, (got.reason, ref.reason)


def test_table_is_built_once_per_snapshot_and_rebuilt_for_new_rows():
    rng = random.Random(7)
    workers = snapshot(rng, 16)
    model = CostModel(CFG)
    rows = [model.costs(w) for w in workers]
    assert CostTable.of(rows) is CostTable.of(list(rows))  # same row objects, another list
    table = CostTable.of(rows)
    assert CostTable.of(table) is table
    model.observe_transfer(workers[0], workers[-1], 1 << 20, 5.0)  # priced per route, not in the rows
    assert CostTable.of([model.costs(w) for w in workers]) is table
    model.observe_prefill(workers[0], 100, 0, 50.0)  # a correction w0's row carries: a new row, a new table
    again = [model.costs(w) for w in workers]
    assert again[0] is not rows[0] and all(a is b for a, b in zip(again[1:], rows[1:]))
    assert CostTable.of(again) is not table


@pytest.mark.parametrize("live", [True, False])
@pytest.mark.parametrize("seed", range(20))
def test_fast_decision_equals_reference_on_simple_tables(seed, live):
    """No sized corrections (every prefill scale 1.0), one chunk size,
    with every decode row decoding, or with idle rows and this router's streams."""
    rng = random.Random(1000 + seed)
    block_size = 16
    def batch():
        return rng.randrange(1, 70) if live else rng.choice((0, 0, rng.randrange(1, 70)))

    workers = [dataclasses.replace(w, capacity=dataclasses.replace(w.capacity, max_prefill_tokens=256),
                                   load=dataclasses.replace(w.load, pending_prefill_tokens=rng.randrange(1, 5000),
                                                            active_decode_batch=batch()))
               for w in snapshot(rng, block_size)]
    if not live:  # at least one idle decode row
        workers[0] = dataclasses.replace(workers[0], role=WorkerRole.DECODE,
                                         load=dataclasses.replace(workers[0].load, active_decode_batch=0))
    model = CostModel(CFG)
    rows = CostTable([model.costs(w, streams=None if live or i == 0 else random_streams(rng))
                      for i, w in enumerate(workers)])
    assert not any(r.pre_scale for r in rows.d_rows) and all(rows.d_live) == live
    for _ in range(60):
        req = random_request(rng, workers, block_size)
        params = DecisionParams(build(CFG.weights()), rng.choice((1, 1, 2, 4)), 0.05)  # k = 1: the key decides
        assert candidates(model, rows, req, params.top_k) == reference_candidates(model, rows.rows, req, params.top_k)
        assert decide(model, rows, req, params) == reference_decide(model, rows.rows, req, params)


@pytest.mark.parametrize("seed", range(30))
def test_patched_table_equals_a_fresh_one(seed):
    """The overlay case: a few rows rebuilt with this router's dispatches; the table patched
    from the previous snapshot's is the fresh table of the new rows, and decides the same."""
    rng = random.Random(2000 + seed)
    block_size = 16
    workers = snapshot(rng, block_size)
    model = learned_model(rng, workers)
    old = CostTable([model.costs(w) for w in workers])
    rows = list(old.rows)
    for i in rng.sample(range(len(rows)), rng.randrange(0, min(4, len(rows)) + 1)):
        rows[i] = model.costs(workers[i], rng.randrange(0, 3000), rng.randrange(0, 50), rng.randrange(0, 3))
    patched, fresh = old.patched(rows), CostTable(rows)
    assert patched is not None
    assert {k: v for k, v in vars(patched).items() if not k.startswith("_")} == \
        {k: v for k, v in vars(fresh).items() if not k.startswith("_")}
    for _ in range(10):
        req = random_request(rng, workers, block_size)
        params = DecisionParams(build(CFG.weights()), rng.choice((1, 2, 4)), 0.05)
        assert decide(model, patched, req, params) == reference_decide(model, rows, req, params)


def test_table_is_patched_only_for_the_same_workers_in_the_same_roles():
    rng = random.Random(9)
    workers = snapshot(rng, 16)
    model = CostModel(CFG)
    old = CostTable([model.costs(w) for w in workers])
    other = dataclasses.replace(workers[0], worker_id="elsewhere")
    assert old.patched([model.costs(other)] + list(old.rows[1:])) is None
    assert old.patched(list(old.rows[1:])) is None


def test_rejections_are_decided_by_the_fast_path_as_by_the_reference():
    """No route meets the targets: the fast path's own rejection (decision.py `_reject`, not
    the reference's `choose`) names the same closest route, the same best of each route and
    the same admissible routes, with the same reason, on snapshots under tight targets."""
    rejects = admissible = 0
    for seed in range(40):
        rng, block_size, workers, model, rows = random_table(3000 + seed)
        for _ in range(20):
            req = dataclasses.replace(random_request(rng, workers, block_size), slo_ttft_ms=rng.uniform(1, 80),
                                      slo_tpot_ms=rng.choice((0.0, rng.uniform(0.5, 30))))
            params = random_params(rng)
            got = decide(model, rows, req, params)
            assert got == reference_decide(model, rows.rows, req, params), got.reason
            rejects += got.outcome is Outcome.REJECT
            admissible += bool(got.admissible)
    assert rejects > 150 and admissible > 100
