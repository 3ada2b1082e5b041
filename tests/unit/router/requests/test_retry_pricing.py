"""Retries are priced as first attempts (router/requests/planner.py `Planner.place`): the
cost model's price ranks the remaining routes of the kind the retry policy allows, the
(P, D) pairs already tried are left out, workers that failed are taken only when no
route avoids them, and a worker that can never hold the request is never taken."""

from __future__ import annotations

import dataclasses

from router.pricing.decision import decide
from router.requests.placement import Demand, choose_pair
from router.requests.planner import Planner
from router.types import Slo
from runtime.directory.cost_profile import CostProfile
from runtime.directory.records import ClusterSnapshot, WorkerRole
from tests.support.orchestrator import CAP, PROMPT, config, worker

PROFILE = CostProfile(prefill_ms_per_token=1.0, decode_base_ms=2.0, decode_ms_per_seq=10.0, kv_bytes_per_block=1000,
                      source="test")


def profiled(w, batch: int = 0):
    return dataclasses.replace(w, profile=PROFILE, load=dataclasses.replace(w.load, active_decode_batch=batch))


def snapshot(*extra) -> ClusterSnapshot:
    """p0 idle, p1 with a queue; d0 the freest but decoding 30 streams, d1 idle with fewer free blocks."""
    return ClusterSnapshot((profiled(worker("p0", WorkerRole.PREFILL)),
                            profiled(worker("p1", WorkerRole.PREFILL, pending=40)),
                            profiled(worker("d0", WorkerRole.DECODE, free=64), batch=30),
                            profiled(worker("d1", WorkerRole.DECODE, free=40)), *extra), route_epoch=7)


def place(planner: Planner, cluster: ClusterSnapshot, split: bool, avoid=None, tried=()):
    c = planner.place("t", PROMPT, 6, Slo(), cluster, None, split, avoid or {}, tried)
    return None if c is None else (c.prefill.worker_id if c.prefill else None, c.decode.worker_id)


def test_a_retry_takes_the_route_the_first_attempts_pricing_takes():
    cluster, planner = snapshot(), Planner(config())
    assert place(planner, cluster, True) == ("p0", "d1")
    assert place(planner, cluster, False) == (None, "d1")
    # The first attempt's decision on the same snapshot prices the same best routes ...
    req = planner._shape("t", PROMPT, 6, Slo(), cluster)[0]
    d = decide(planner.costs, planner.rows(cluster, None), req, planner.params)
    assert (d.best_disaggregated.prefill.worker_id, d.best_disaggregated.decode.worker_id) == ("p0", "d1")
    assert d.best_colocated.decode.worker_id == "d1"
    # ... where queue and free blocks alone (the placement retries used before) take the freest D.
    assert [w.worker_id for w in choose_pair(cluster, Demand(len(PROMPT), 6))] == ["p0", "d0"]


def test_tried_pairs_are_left_out():
    cluster, planner = snapshot(), Planner(config())
    assert place(planner, cluster, True, tried={("p0", "d1")}) in {("p1", "d1"), ("p0", "d0")}
    assert place(planner, cluster, True, tried={("p0", "d1"), ("p1", "d1"), ("p0", "d0"), ("p1", "d0")}) is None
    assert place(planner, cluster, False, tried={("p0", "d1")}) == (None, "d1")  # pairs only


def test_avoided_workers_are_taken_only_when_no_route_avoids_them_least_penalized_first():
    cluster, planner = snapshot(), Planner(config())
    assert place(planner, cluster, True, {"d1": 1}) == ("p0", "d0")
    assert place(planner, cluster, True, {"p0": 2}) == ("p1", "d1")
    assert place(planner, cluster, True, {"d0": 2, "d1": 1}) == ("p0", "d1")
    assert place(planner, cluster, True, {"d0": 1, "d1": 2}) == ("p0", "d0")
    assert place(planner, cluster, False, {"d1": 1}) == (None, "d0")
    assert place(planner, cluster, False, {"d0": 3, "d1": 3}) == (None, "d1")  # all avoided: priced as usual


def test_a_worker_that_can_never_hold_the_request_is_never_taken():
    small = dataclasses.replace(CAP, total_blocks=1)
    tiny = dataclasses.replace(profiled(worker("d2", WorkerRole.DECODE)), capacity=small)
    cluster, planner = snapshot(tiny), Planner(config())
    assert place(planner, cluster, False, {"d0": 1, "d1": 1}) == (None, "d1")
    alone = ClusterSnapshot((profiled(worker("p0", WorkerRole.PREFILL)), tiny), route_epoch=7)
    assert place(planner, alone, True) is None and place(planner, alone, False) is None
