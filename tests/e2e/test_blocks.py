"""`pdctl blocks` (Admin.Blocks) on a real cluster: while a request decodes, its
blocks show under its request id, tenant and state; once it is over nothing is held
but cached prefix; a reservation made behind the router's back (the test poses as
the router at decode-0, for a request the router never ran) is an orphan naming
that request until its TTL reclaims it — and `assert_cluster_clean` names it too."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import grpc
import pytest

from pdserve_client.rpc.pd.v1 import blocks_pb2, blocks_pb2_grpc, common_pb2, decode_pb2, decode_pb2_grpc
from pdserve_client.types import PdError
from tests.support.cluster import assert_cluster_clean, channel, client, start_cluster, tls_env

PROMPT = [5 + (7 * i) % 300 for i in range(70)]  # 4 full blocks of 16 and a partial one
TTL_S = 4.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("blocks"), prefill=1, decode=1, transport="tcp",
                      reservation_ttl_s=TTL_S)
    yield c
    c.down()


def _wait(fn, timeout_s: float = 15.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_a_decoding_request_is_named_and_nothing_but_cached_prefix_is_left_after(cluster):
    rid = f"blocks-{uuid.uuid4().hex[:8]}"
    with client(cluster, "operator") as ops, client(cluster) as sdk:
        stream = sdk.generate(prompt_ids=PROMPT, max_tokens=1900, ignore_eos=True, request_id=rid,
                              mode="disaggregated")
        with stream:
            tokens = iter(stream)
            next(tokens)  # the prefill's token 0 (it leaves before the hand-off ends)
            next(tokens)  # the decode's first: it decodes from its own blocks
            view = ops.blocks(request_id=rid)
            stream.cancel("seen")
        (d0,) = [w for w in view.workers if w.worker_id == "decode-0"]
        (h,) = d0.holdings
        assert (h.request_id, h.tenant, h.transfer_id, h.state, h.orphan) == \
            (rid, "default", f"{rid}/1", "decoding", False)
        assert h.num_blocks >= 1900 // 16 and h.age_s > 0 and len(h.block_ids) == h.num_blocks
        for w in view.workers:
            assert w.free_blocks + w.reserved_blocks + w.active_blocks == w.total_blocks
            assert w.cached_prefix_blocks <= w.free_blocks
        sdk.generate_full(prompt_ids=PROMPT, max_tokens=4)

        def idle():
            v = ops.blocks()
            return v if all(not w.holdings and not w.error for w in v.workers) else None
        after = _wait(idle)
    assert after is not None, "holdings left after the requests ended"
    assert after.orphan_holdings == 0 and after.in_flight_requests == 0
    by = {w.worker_id: w for w in after.workers}
    assert by["decode-0"].cached_prefix_blocks >= 4 and by["prefill-0"].cached_prefix_blocks >= 4
    assert all(w.free_blocks == w.total_blocks for w in after.workers)  # the cached prefix is free
    assert_cluster_clean(cluster)


def test_a_reservation_the_router_never_made_is_an_orphan_until_its_ttl(cluster):
    rid = f"leak-{uuid.uuid4().hex[:8]}"
    stub = decode_pb2_grpc.DecodeStub(channel(cluster, "decode-0", "router"))
    stub.Reserve(decode_pb2.DecodeReserveRequest(
        request_id=rid, tenant="t-leak", generation=3, prompt_token_ids=PROMPT, max_tokens=8,
        sampling=common_pb2.SamplingParams()), timeout=10)
    with client(cluster, "operator") as ops:
        view = ops.blocks(orphans_only=True)
        ((worker_id, h),) = view.orphans
        assert (worker_id, h.request_id, h.tenant, h.generation, h.state) == \
            ("decode-0", rid, "t-leak", 3, "reserved")
        assert h.orphan_reason == "request not in flight at the router and no open transaction"
        assert view.orphan_holdings == 1
        with pytest.raises(AssertionError) as leak:
            assert_cluster_clean(cluster, timeout_s=0.5)
        assert rid in str(leak.value) and "reserved" in str(leak.value)
        gone = _wait(lambda: not ops.blocks(request_id=rid).orphans, TTL_S + 10)
    assert gone, f"{rid} still held after the reservation TTL"
    assert_cluster_clean(cluster)


def test_only_an_operator_may_look_and_pdctl_prints_it(cluster):
    with client(cluster) as sdk, pytest.raises(PdError) as denied:
        sdk.blocks()
    assert denied.value.code == "PERMISSION_DENIED"
    worker = blocks_pb2_grpc.WorkerAdminStub(channel(cluster, "decode-0", "operator"))
    with pytest.raises(grpc.RpcError) as not_router:
        worker.Blocks(blocks_pb2.WorkerBlocksRequest(), timeout=10)
    assert not_router.value.code() == grpc.StatusCode.PERMISSION_DENIED  # worker RPCs: the router only
    cli = [sys.executable, "-m", "pdserve_ops.cli", "--router", cluster.router_address, "blocks"]
    out = subprocess.run([*cli, "--json"], env=tls_env(cluster, "operator"), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert sorted(w["worker_id"] for w in view["workers"]) == ["decode-0", "prefill-0"]
    text = subprocess.run([*cli, "--orphans-only"], env=tls_env(cluster, "operator"), capture_output=True,
                          text=True, timeout=60)
    assert text.returncode == 0 and "0 orphan(s)" in text.stdout, text.stderr
    refused = subprocess.run(cli, env=tls_env(cluster, "client"), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stderr
