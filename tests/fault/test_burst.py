"""A burst far over the cluster's K/V room is queued, not shed (docs/architecture.md,
Router retries and the admission queue; tooling/cluster/faults.burst).

200 concurrent requests (prompts of 1-400 tokens, 24 tokens each) on one decode
worker of 512 blocks: together they need several times the pool. Before the
admission queue 115-145 of 200 succeeded and the rest failed RESOURCE_EXHAUSTED
within 1.7 s, every retry hitting the same saturated worker (56 of 200 in this test
on that router). Now every one is served at its first attempt within its deadline
(no worker refuses for room), and the cluster ends clean.

The router admits by the decode's room; the prefill's pool here is a fifth of it, so
its jobs often find it full of prefills about to free theirs and wait there
(prefill_worker/room.py). Refused instead, 45 of 200 failed their first attempt
(one fresh-clone CI run also saw it once with equal pools, 1 of 200).
"""

from __future__ import annotations

import pytest

from tests.support.cluster import seeded_requests, start_cluster
from tooling.cluster.load import burst

PREFILL_BLOCKS = 96
"""The prefill's pool: a fifth of the decode's, which the router's admission counts."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("burst"), prefill=1, decode=1, num_blocks=512,
                      prefill_num_blocks=PREFILL_BLOCKS)
    yield c
    c.down()


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_a_200_request_burst_is_queued_and_served(cluster, mode):
    r = burst(cluster, seeded_requests(200, seed=15, max_prompt=400), mode)
    assert (r.ok, r.failed) == (200, 0), r.errors[:3]
    assert (r.held_blocks, r.open_txns) == (0, 0), r
