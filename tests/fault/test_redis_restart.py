"""Redis restarted under a running cluster, with its data (AOF) and without it
(docs/design.md, The transaction): fences never move backwards. Worker epochs and the route epoch
after the restart are at least what they were (strictly larger for workers that had
to register again), requests are served disaggregated again with the same tokens,
and the cluster ends clean."""

from __future__ import annotations

import shutil
import signal
import time

import pytest

from tests.support.cluster import assert_cluster_clean, client, start_cluster
from tooling.cluster.faults import advance_route_epoch, fences

PROMPT = list(range(3, 120))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One cluster for both restarts: each starts from the one before it ended clean."""
    c = start_cluster(tmp_path_factory.mktemp("redis-restart"), prefill=1, decode=1, transport="tcp",
                      lease_ttl_s=2.0)
    yield c
    c.down()


@pytest.mark.parametrize("keep_data", [True, False], ids=["with-data", "data-lost"])
def test_fences_never_move_backwards_across_a_redis_restart(cluster, keep_data):
    with client(cluster, timeout_s=60) as sdk:
        before = sdk.generate_full(prompt_ids=PROMPT, max_tokens=4, ignore_eos=True, mode="disaggregated")
        advance_route_epoch(cluster)
        time.sleep(1.5)  # appendfsync everysec: what the restart may keep is on disk
        epochs, route_epoch = fences(cluster)
        assert len(epochs) == 2 and route_epoch > 0

        cluster.signal("redis", signal.SIGKILL)
        if not keep_data:
            for path in cluster.state.glob("appendonly*"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        cluster.restart("redis")

        deadline = time.monotonic() + 30
        while True:  # leases lapse during the outage (or with the data): workers register again
            try:
                again = sdk.generate_full(prompt_ids=PROMPT, max_tokens=4, ignore_eos=True,
                                             mode="disaggregated")
                if again.route == "disaggregated":
                    break
            except Exception:  # noqa: BLE001 - the directory may still be reconnecting
                pass
            assert time.monotonic() < deadline, "disaggregated serving did not resume"
            time.sleep(0.2)
        assert again.token_ids == before.token_ids
    after, route_after = fences(cluster)
    assert set(after) == set(epochs)
    for wid, epoch in after.items():
        assert epoch >= epochs[wid], (wid, epochs[wid], epoch)
        if not keep_data:
            assert epoch > epochs[wid], (wid, epochs[wid], epoch)  # registered again, above
    assert route_after >= route_epoch, (route_epoch, route_after)
    assert_cluster_clean(cluster)
