"""A directory outage does not take colocated serving down (docs/design.md, Failures).

Real processes (1 prefill, 1 decode, tiny, tcp): the directory is killed with
SIGKILL; for longer than a worker's lease every request, whichever mode it asks
for, is served colocated — at its first attempt once the router has seen one
directory call fail. The directory comes back on the
same address (over the same Redis); the workers re-register and disaggregated
routes resume; nothing leaks.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.cluster import assert_cluster_clean, client, start_cluster

PROMPT = list(range(3, 90))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("dir-outage"), prefill=1, decode=1, transport="tcp")
    yield c
    c.down()


def test_colocated_serving_outlives_the_directory(cluster):
    with client(cluster, timeout_s=60) as sdk:
        first = sdk.generate_full(prompt_ids=PROMPT, max_tokens=4, ignore_eos=True)
        assert first.route == "disaggregated"
        cluster.signal("directory", signal.SIGKILL)
        outage_ends = time.monotonic() + 2 * cluster.spec.lease_ttl_s
        served = []
        while time.monotonic() < outage_ends:
            for mode in ("disaggregated", "colocated"):
                served.append(sdk.generate_full(prompt_ids=PROMPT, max_tokens=4, ignore_eos=True, mode=mode))
        assert len(served) >= 4
        # The router learns of the outage from the first failed directory call (a cached
        # snapshot was still fresh); every request after it goes colocated at once.
        assert served[0].attempts == 1 or "directory reserve: UNAVAILABLE" in served[0].failed_attempts
        assert all(r.route == "colocated" and r.attempts == 1 for r in served[1:]), \
            [(r.route, r.attempts, r.failed_attempts) for r in served]
        assert all(r.token_ids == first.token_ids for r in served)  # exact either way

        cluster.restart("directory")
        deadline = time.monotonic() + 30
        while True:  # the workers notice their lost leases and register again
            again = sdk.generate_full(prompt_ids=PROMPT, max_tokens=4, ignore_eos=True)
            if again.route == "disaggregated" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert again.route == "disaggregated" and again.token_ids == first.token_ids
    assert_cluster_clean(cluster)
