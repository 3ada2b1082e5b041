"""A burst far over the cluster's K/V room is queued, not shed (issue 15, item 6).

200 concurrent requests (prompts of 1-400 tokens, 24 tokens each) on one decode
worker of 512 blocks: together they need several times the pool. Before the
admission queue 115-145 of 200 succeeded and the rest failed RESOURCE_EXHAUSTED
within 1.7 s, every retry hitting the same saturated worker. Now every one is
served within its deadline, the pool is never over-committed (no reserve is
refused), and the cluster ends clean.
"""

from __future__ import annotations

import pytest

from cluster_support import assert_cluster_clean, generate_all, seeded_requests, start_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("burst"), prefill=1, decode=1, num_blocks=512,
                      lease_ttl_s=1.5)
    yield c
    c.down()


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_a_200_request_burst_is_queued_and_served(cluster, mode):
    prompts = seeded_requests(200, seed=15, max_prompt=400)
    results = generate_all(cluster.router_address, prompts, concurrency=200, max_tokens=24,
                           mode=mode, ignore_eos=True, deadline_s=90, raise_errors=False)
    failed = [r for r in results if isinstance(r, Exception)]
    assert not failed, f"{len(failed)} of 200 failed, first: {failed[:3]}"
    assert all(len(r.token_ids) == 24 for r in results)
    refused = [r.failed_attempts for r in results if r.failed_attempts]
    assert not refused, refused[:3]
    assert_cluster_clean(cluster)
