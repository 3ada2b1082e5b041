"""End to end, real processes: workers exchange K/V only with workers whose kernels
compute the same bits, and a worker whose start-up self-check fails hands off nothing.

Five workers (tiny, UCX): prefill-0 and decode-0 with the default attention tile
(128 tokens), prefill-1 and decode-1 with 64 — a tile orders the online softmax, so
their K/V differ and so do their cache ABI digests — and mixed-0, whose lm_head is
made row-count dependent (PD_FAULT_ROW_DEPENDENT_KERNELS), so its self-check fails
and it registers colocated-only.
"""

from __future__ import annotations

import random
import subprocess
import sys

import grpc
import pytest

from pdserve_client.rpc.pd.v1 import decode_pb2, decode_pb2_grpc
from runtime.engine import Engine, EngineConfig, SamplingParams
from tests.support.cluster import (
    _directory,
    assert_cluster_clean,
    channel,
    client,
    generate_all,
    start_cluster,
    tls_env,
)
from tooling.cluster.launcher import REPO_ROOT

TILE_64 = {"PD_ATTN_TILE_TOKENS": "64"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("numerics")
    c = start_cluster(tmp, prefill=2, decode=2, mixed=1, mode="disaggregated", num_blocks=256,
                      env={"PD_PROFILE_BUDGET_S": "1", "PD_PROFILE_FILE": str(tmp / "profile.json")},
                      worker_env={"prefill-1": TILE_64, "decode-1": TILE_64,
                                  "mixed-0": {"PD_FAULT_ROW_DEPENDENT_KERNELS": "1"}})
    yield c
    c.down()


def _digests(cluster) -> dict[str, str]:
    snap, _ = _directory(cluster)
    return {w.worker_id: w.cache_abi_digest for w in snap.workers}


def test_digests_follow_numerics(cluster):
    d = _digests(cluster)
    assert d["prefill-0"] == d["decode-0"] and d["prefill-1"] == d["decode-1"]
    assert d["decode-0"] != d["decode-1"]
    assert list(d.values()).count(d["mixed-0"]) == 1, "a failed self-check shares its digest with nobody"


def test_router_pairs_each_prefill_worker_only_with_its_numerics(cluster):
    rng = random.Random(14)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randrange(70, 300))] for _ in range(16)]
    split = generate_all(cluster, prompts, max_tokens=12, ignore_eos=True, mode="disaggregated")
    pairs = {(r.prefill_worker, r.decode_worker) for r in split if r.route == "disaggregated"}
    assert pairs == {("prefill-0", "decode-0"), ("prefill-1", "decode-1")}, pairs
    assert "mixed-0" not in {w for r in split for w in (r.prefill_worker, r.decode_worker)}
    # Tokens equal a one-process run of the same numerics (the decode worker's tile).
    engines = {tile: Engine.from_preset("tiny", cfg=EngineConfig(num_blocks=64, attn_tile_tokens=tile))
               for tile in (64, 128)}
    for p, r in zip(prompts, split):
        if r.route == "disaggregated":
            tile = 64 if r.decode_worker == "decode-1" else 128
            assert r.token_ids == engines[tile].generate(p, 12, SamplingParams(ignore_eos=True)), r.decode_worker
    assert_cluster_clean(cluster)


def test_forcing_the_incompatible_pair_is_refused(cluster):
    """decode-1 (tile 64) refuses a reservation for K/V encoded with prefill-0's ABI."""
    digests = _digests(cluster)
    with channel(cluster, "decode-1", "router") as ch:
        with pytest.raises(grpc.RpcError) as err:
            decode_pb2_grpc.DecodeStub(ch).Reserve(decode_pb2.DecodeReserveRequest(
                request_id="forced", tenant="t", generation=1, prompt_token_ids=list(range(3, 60)),
                max_tokens=4, cache_abi_digest=digests["prefill-0"]), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"cache ABI digest {digests['prefill-0']} does not match this worker's {digests['decode-1']}" \
        in err.value.details()
    assert "attention tile 64" in err.value.details()
    assert_cluster_clean(cluster)


def test_failed_self_check_is_colocated_only_and_says_why(cluster):
    with client(cluster) as sdk:
        workers = {w.worker_id: w for w in sdk.status().workers}
    why = workers["mixed-0"].colocated_only_reason
    assert why.startswith("lm_head: rows 0..0 computed apart differ"), why
    assert all(not w.colocated_only_reason for name, w in workers.items() if name != "mixed-0")
    out = subprocess.run([sys.executable, "-m", "pdserve_ops.cli", "status", "--router", cluster.router_address],
                         cwd=REPO_ROOT, env=tls_env(cluster), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"mixed-0: colocated only, no K/V hand-off: {why}" in out.stdout
