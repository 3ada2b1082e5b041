"""End to end, real processes: workers that serve both phases (`--serve-prefill`, role mixed).

Two mixed workers and no others (tiny preset, UCX data plane). Each registers
as mixed; the router splits requests between them in both directions
(prefill on one, K/V over UCX to the other, decode there) and runs colocated
requests on either. Split tokens equal colocated tokens, and nothing leaks.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from runtime.directory.records import WorkerRole
from tests.support.cluster import _directory, assert_cluster_clean, client, generate_all, start_cluster
from tests.support.metrics import scrape_process


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mixed")
    c = start_cluster(tmp, prefill=0, decode=0, mixed=2, mode="disaggregated", num_blocks=512,
                      env={"PD_PROFILE_BUDGET_S": "2", "PD_PROFILE_FILE": str(tmp / "profile.json")})
    c.metrics = lambda worker: scrape_process(c, worker).as_dict()
    yield c
    c.down()


def test_mixed_workers_register_both_roles(cluster):
    snap, _ = _directory(cluster)
    assert sorted((w.worker_id, w.role) for w in snap.workers) == [
        ("mixed-0", WorkerRole.MIXED), ("mixed-1", WorkerRole.MIXED)]
    assert all(w.data_plane_address.startswith("ucx://") for w in snap.workers)


def test_split_in_both_directions_equals_colocated(cluster):
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randrange(40, 300))] for _ in range(16)]
    split = generate_all(cluster, prompts, max_tokens=24, ignore_eos=True, mode="disaggregated")
    # Placement reads the load each worker last reported (a heartbeat a lease third apart):
    # wait until both report the split requests' blocks free, so the colocated requests are
    # placed on two idle workers rather than on a report taken mid-split.
    assert_cluster_clean(cluster)
    time.sleep(0.5)  # past the router's snapshot reuse (4 x PD_ROUTER_SNAPSHOT_MAX_AGE_MS)
    colo = generate_all(cluster, prompts, max_tokens=24, ignore_eos=True, mode="colocated")
    pairs = {(r.prefill_worker, r.decode_worker) for r in split}
    assert all(r.route == "disaggregated" for r in split)
    assert all(p != d and {p, d} <= {"mixed-0", "mixed-1"} for p, d in pairs), pairs
    assert pairs == {("mixed-0", "mixed-1"), ("mixed-1", "mixed-0")}, \
        f"8 concurrent requests should use both directions: {pairs}"
    assert all(r.route == "colocated" for r in colo)
    assert {r.decode_worker for r in colo} == {"mixed-0", "mixed-1"}
    for s, c in zip(split, colo):
        assert s.token_ids == c.token_ids
    assert_cluster_clean(cluster)


def test_a_mixed_workers_metrics_show_what_it_sent_and_what_it_received(cluster):
    """Each mixed worker's /metrics has its sender's and its receiver's figures, and
    the bytes one sent the other received (8 concurrent splits go both ways, as above)."""
    with client(cluster) as sdk, ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda i: sdk.generate_full(
            prompt_ids=[3 + (i + j) % 500 for j in range(300)], max_tokens=2, ignore_eos=True,
            mode="disaggregated"), range(8)))
    assert {r.prefill_worker for r in done} == {"mixed-0", "mixed-1"}

    def total(m, name):
        return sum(v for (n, _), v in m.items() if n == name)

    deadline = time.monotonic() + 5
    while True:
        m0, m1 = cluster.metrics("mixed-0"), cluster.metrics("mixed-1")
        sent = [total(m, "pd_transfer_sent_bytes_total") for m in (m0, m1)]
        got = [total(m, "pd_transfer_received_bytes_total") for m in (m0, m1)]
        if (all(sent) and sent == got[::-1]) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(sent) and all(got), (sent, got)
    assert sent == got[::-1], "the bytes mixed-0 sent are the bytes mixed-1 received, and back"
