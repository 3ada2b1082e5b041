"""The attacks docs/design.md, Security, guards against, each tried against a real local
cluster with mutual TLS on.

One cluster (one prefill, one decode worker, UCX data plane) started from a state dir
named `.pdserve`, so pdctl run from its parent finds the certificates with no flags.
Every attack worked on the code before security (plaintext ports, no identities);
each now fails with the status named, and nothing it aimed at changes.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve_client import Client, contract
from pdserve_client.rpc.pd.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    decode_pb2,
    decode_pb2_grpc,
    manifest_pb2,
    prefill_pb2,
    prefill_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)
from pdserve_client.tls import TlsFiles
from runtime.directory.client import NonceRefused
from runtime.directory.records import WorkerCapacity, WorkerInfo, WorkerRole
from runtime.directory.states import TxnState
from runtime.security.pki import Identity, LocalCA
from runtime.security.tls import Security
from tests.support.cluster import address, assert_cluster_clean, channel, directory, pdctl, start_cluster

SERVICES = ("router", "directory", "prefill-0", "decode-0")
PROMPT = [3 + (7 * i) % 500 for i in range(160)]  # 10 blocks of 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("sec"), state_name=".pdserve", prefill=1, decode=1,
                      transport="ucx", lease_ttl_s=2.0)
    LocalCA(c.tls_dir).issue(Identity("prefill", "prefill-9"))  # a real worker's cert, not an end of anything
    yield c
    c.down()


def code_of(call) -> grpc.StatusCode:
    try:
        result = call()
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            list(result)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def health(ch) -> grpc.StatusCode:
    return code_of(lambda: health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5))


def dir_run(cluster, identity: str, fn):
    """fn(DirectoryClient as `identity`); returns its value or the gRPC status it raised."""
    async def go():
        async with directory(cluster, identity) as d:
            try:
                return await fn(d)
            except grpc.aio.AioRpcError as e:
                return e.code()
            except NonceRefused:  # the client's name for ConsumeNonce's PERMISSION_DENIED
                return grpc.StatusCode.PERMISSION_DENIED
    return asyncio.run(go())


# ---- transport: plaintext and foreign certificates ---------------------------

@pytest.mark.parametrize("name", SERVICES)
def test_plaintext_calls_fail_on_every_service(cluster, name):
    with grpc.insecure_channel(address(cluster, name)) as ch:
        assert health(ch) == grpc.StatusCode.UNAVAILABLE
    with channel(cluster, name, "operator") as ch:  # the same call with a certificate: served
        assert health(ch) == grpc.StatusCode.OK


@pytest.mark.parametrize("name", SERVICES)
@pytest.mark.parametrize("trusts", ["own CA", "cluster CA"])
def test_a_certificate_from_another_ca_fails_on_every_service(cluster, tmp_path, name, trusts):
    """Even naming itself router/router, and even trusting the cluster's CA (so only the
    server's check of the client certificate stands in its way)."""
    evil = LocalCA(tmp_path / "evil")
    evil.issue(Identity("router", "router"), "router")
    files = TlsFiles.in_dir(evil.dir, "router")
    if trusts == "cluster CA":
        files = TlsFiles(files.cert, files.key, (cluster.tls_dir / contract.TLS_CA_FILE).read_bytes())
    service = contract.SERVER_ROLES[cluster.roles[name]][0]
    with Security.of(files).channel(address(cluster, name), service) as ch:
        assert health(ch) == grpc.StatusCode.UNAVAILABLE


# ---- roles: a client (or an operator) calling what only the router may ----------

WORKER_CALLS = [
    ("decode-0", lambda ch: decode_pb2_grpc.DecodeStub(ch).Reserve(decode_pb2.DecodeReserveRequest(
        request_id="x", generation=1, prompt_token_ids=[1, 2, 3], max_tokens=2), timeout=10)),
    ("decode-0", lambda ch: decode_pb2_grpc.DecodeStub(ch).DecodeStream(decode_pb2.DecodeStreamRequest(
        request_id="x", generation=1, transfer_id="x/1"), timeout=10)),
    ("decode-0", lambda ch: decode_pb2_grpc.DecodeStub(ch).Cancel(common_pb2.CancelRequest(request_id="x"),
                                                                  timeout=10)),
    ("prefill-0", lambda ch: prefill_pb2_grpc.PrefillStub(ch).Prefill(iter([prefill_pb2.PrefillRequest(
        manifest=manifest_pb2.HandoffManifest(request_id="x", generation=1, transfer_id="x/1"),
        prompt_token_ids=[1, 2, 3])]), timeout=10)),
]


@pytest.mark.parametrize("identity", ["client", "operator", "prefill-9"])
@pytest.mark.parametrize("call", range(len(WORKER_CALLS)), ids=["Decode.Reserve", "Decode.DecodeStream",
                                                                 "Decode.Cancel", "Prefill.Prefill"])
def test_only_the_router_calls_a_worker(cluster, identity, call):
    name, rpc = WORKER_CALLS[call]
    with channel(cluster, name, identity) as ch:
        assert code_of(lambda: rpc(ch)) == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("identity", ["client", "decode-0", "router"])
def test_set_mode_needs_the_operator(cluster, identity):
    def set_mode(who):
        with channel(cluster, "router", who) as ch:
            return code_of(lambda: admin_pb2_grpc.AdminStub(ch).SetMode(admin_pb2.SetModeRequest(
                mode=admin_pb2.RELEASE_MODE_SHADOW, reason="attack"), timeout=10))
    assert set_mode(identity) == grpc.StatusCode.PERMISSION_DENIED
    with channel(cluster, "router", "client") as ch:
        assert admin_pb2_grpc.AdminStub(ch).Status(admin_pb2.StatusRequest(), timeout=10).mode == \
            admin_pb2.RELEASE_MODE_ACTIVE


# ---- the directory: rogue workers and outsiders ---------------------------------

CAP = WorkerCapacity(total_blocks=100_000, max_decode_batch=8, max_prefill_tokens=2048, block_size=16,
                     vocab_size=512, max_model_len=2048)


@pytest.mark.parametrize("identity,worker_id,role", [
    ("client", "rogue", WorkerRole.DECODE),
    ("prefill-0", "rogue", WorkerRole.PREFILL),        # a real certificate, another id
    ("prefill-0", "prefill-0", WorkerRole.DECODE),     # its own id, another role
    ("prefill-0", "decode-0", WorkerRole.DECODE),      # taking over a live worker
])
def test_a_rogue_registration_is_refused(cluster, identity, worker_id, role):
    before = dir_run(cluster, "operator", lambda d: d.snapshot())
    info = WorkerInfo(worker_id, role, "127.0.0.1:1", "127.0.0.1:2", before.workers[0].cache_abi_digest, CAP)
    assert dir_run(cluster, identity, lambda d: d.register_worker(info)) == grpc.StatusCode.PERMISSION_DENIED
    after = dir_run(cluster, "operator", lambda d: d.snapshot())
    assert {w.worker_id: (w.role, w.epoch) for w in after.workers} == \
        {w.worker_id: (w.role, w.epoch) for w in before.workers}
    assert "rogue" not in {w.worker_id for w in after.workers}


def _held_transaction(cluster, tid: str) -> manifest_pb2.HandoffManifest:
    """A transaction prefill-0 -> decode-0 reserved through the router's certificate
    (an open hand-off an outsider could find and try to drive)."""
    snap = dir_run(cluster, "operator", lambda d: d.snapshot())
    w = {x.worker_id: x for x in snap.workers}
    m = manifest_pb2.HandoffManifest(
        request_id=tid, tenant="default", generation=1, transfer_id=f"{tid}/1", block_size=16,
        token_interval=manifest_pb2.TokenInterval(start=0, end=16), reservation_id=f"res-{tid}",
        expected_chunks=[manifest_pb2.ChunkSpec(layer=0, block_count=1, num_bytes=64, checksum="c")],
        source_worker_id="prefill-0", source_epoch=w["prefill-0"].epoch,
        destination_worker_id="decode-0", destination_epoch=w["decode-0"].epoch,
        checksum_algorithm="xxh3_64", cache_abi_digest=w["decode-0"].cache_abi_digest,
        route_epoch=snap.route_epoch)
    assert dir_run(cluster, "router", lambda d: d.reserve(m)).ok
    return m


def test_outsiders_cannot_move_create_or_revoke_at_the_directory(cluster):
    m = _held_transaction(cluster, "held")
    rid, tid, src, dst = m.request_id, m.transfer_id, ("prefill-0", m.source_epoch), \
        ("decode-0", m.destination_epoch)
    epoch = dir_run(cluster, "operator", lambda d: d.get_route_epoch())
    denied = grpc.StatusCode.PERMISSION_DENIED
    moves = {  # each names a real end of the transaction, as a forger would
        "Begin": lambda d: d.begin(rid, tid, 1, *src, kv_digest="00" * 16),
        "Validated": lambda d: d.validated(rid, tid, 1, *dst, "00" * 16, list(m.expected_chunks)),
        "Publish": lambda d: d.publish(rid, tid, 1, *dst, kv_digest="00" * 16),
        "Abort": lambda d: d.abort(rid, tid, 1, *dst, reason="attack"),
    }
    for who in ("client", "operator", "prefill-9"):
        for rpc, move in moves.items():
            assert dir_run(cluster, who, move) == denied, (who, rpc)
    # Each end may move only its own steps: the destination cannot begin, the source cannot publish.
    assert dir_run(cluster, "decode-0", moves["Begin"]) == denied
    assert dir_run(cluster, "prefill-0", lambda d: d.publish(rid, tid, 1, *src, kv_digest="00" * 16)) == denied
    assert dir_run(cluster, "operator", lambda d: d.lookup(rid, tid)).state == TxnState.RESERVED

    forged = manifest_pb2.HandoffManifest()
    forged.CopyFrom(m)
    forged.request_id, forged.transfer_id = "forged", "forged/1"
    for who in ("client", "operator", "prefill-0", "decode-0"):
        assert dir_run(cluster, who, lambda d: d.reserve(forged)) == denied, who
    assert dir_run(cluster, "operator", lambda d: d.lookup("forged", "forged/1")) is None
    for who in ("decode-0", "prefill-0"):
        assert dir_run(cluster, who, lambda d: d.advance_route_epoch(reason="attack")) == denied, who
    assert dir_run(cluster, "operator", lambda d: d.get_route_epoch()) == epoch

    nonce, expires_ms = "n-held", int(time.time() * 1000) + 30_000
    for who in ("prefill-0", "prefill-9", "client", "router"):
        assert dir_run(cluster, who, lambda d: d.consume_nonce(nonce, expires_ms, tid)) == denied, who
    assert dir_run(cluster, "decode-0", lambda d: d.consume_nonce(nonce, expires_ms, tid)) is True  # not burned

    assert dir_run(cluster, "router", lambda d: d.abort(rid, tid, 1, "router", 0, reason="test done")).ok
    assert_cluster_clean(cluster)


# ---- the router's port: tenants ---------------------------------------------------

@pytest.fixture(scope="module")
def tenant_b(cluster):
    return cluster.issue_client("b")


def admin(cluster, files: TlsFiles, rpc: str, request):
    with Security.of(files).channel(cluster.router_address, "router") as ch:
        return getattr(admin_pb2_grpc.AdminStub(ch), rpc)(request, timeout=10)


def test_another_tenant_cannot_cancel_see_or_impersonate(cluster, tenant_b):
    a_files = cluster.client_files("client")
    with cluster.client(timeout_s=60) as a, Client(cluster.router_address, tls_files=tenant_b) as b:
        stream = a.generate(prompt_ids=PROMPT, max_tokens=200, ignore_eos=True, request_id="victim")
        next(iter(stream))  # in flight
        assert b.cancel("victim") is False  # NOT_FOUND: not a request of tenant b
        seen_by_b = admin(cluster, tenant_b, "Decisions", admin_pb2.DecisionsRequest(limit=1000))
        result = stream.collect()
    assert len(result.token_ids) == 200 and not result.failed_attempts, result
    assert "victim" not in {r.request_id for r in seen_by_b.records}

    # Not vacuous: tenant A itself sees both.
    assert "victim" in {r.request_id for r in admin(cluster, a_files, "Decisions",
                                                    admin_pb2.DecisionsRequest(limit=1000)).records}
    # An open transaction of tenant A (a hand-off's lasts milliseconds; this one is held).
    m = _held_transaction(cluster, "held-a")
    listed = {who: {t.request_id for t in admin(cluster, files, "ListTransactions",
                                                 admin_pb2.ListTransactionsRequest()).transactions}
              for who, files in (("a", a_files), ("b", tenant_b))}
    assert dir_run(cluster, "router", lambda d: d.abort(m.request_id, m.transfer_id, 1, "router", 0)).ok
    assert "held-a" in listed["a"] and "held-a" not in listed["b"], listed

    claim = router_pb2.GenerateRequest(request_id="claim", tenant="default", max_tokens=2,
                                       prompt_token_ids=common_pb2.TokenIds(ids=PROMPT))
    with Security.of(tenant_b).channel(cluster.router_address, "router") as ch:
        assert code_of(lambda: router_pb2_grpc.RouterStub(ch).Generate(claim, timeout=30)) == \
            grpc.StatusCode.PERMISSION_DENIED
    assert_cluster_clean(cluster)


def _compute_tokens(cluster, files: TlsFiles, request_id: str, mode: str, prompt: list[int]) -> int:
    with Client(cluster.router_address, tls_files=files, timeout_s=60) as c:
        c.generate_full(prompt_ids=prompt, max_tokens=2, ignore_eos=True, mode=mode, request_id=request_id)
    (rec,) = admin(cluster, files, "Decisions", admin_pb2.DecisionsRequest(request_id=request_id)).records
    assert rec.prompt_tokens == len(prompt)
    return rec.compute_tokens


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_no_prefix_reuse_across_tenants(cluster, tenant_b, mode):
    """Tenant A's repeat of its prompt hits its cached prefix; tenant B's same prompt,
    sent after, computes every token (the hit would tell B that A sent it)."""
    a_files = cluster.client_files("client")
    prompt = [t + (1 if mode == "colocated" else 2) for t in PROMPT]  # a prompt no earlier test sent
    _compute_tokens(cluster, a_files, f"a-first-{mode}", mode, prompt)
    time.sleep(2 * cluster.spec.lease_ttl_s)  # heartbeats carry the cached prefixes to the router
    assert _compute_tokens(cluster, a_files, f"a-again-{mode}", mode, prompt) < len(prompt)
    assert _compute_tokens(cluster, tenant_b, f"b-same-{mode}", mode, prompt) == len(prompt)
    assert_cluster_clean(cluster)


# ---- pdctl ---------------------------------------------------------------------------

def test_pdctl_works_with_no_flags_and_set_mode_needs_the_operator(cluster):
    status = pdctl(cluster, "status")
    assert status.returncode == 0, status.stderr
    assert "decode-0" in status.stdout and "prefill-0" in status.stdout
    gen = pdctl(cluster, "generate", "--prompt-ids", "5,6,7,8", "--max-tokens", "3", "--ignore-eos", "--ids")
    assert gen.returncode == 0, gen.stderr
    refused = pdctl(cluster, "set-mode", "shadow", "--identity", "client")
    assert refused.returncode != 0 and "PERMISSION_DENIED" in refused.stdout + refused.stderr
    assert "release mode" not in refused.stdout or "shadow" not in refused.stdout
    assert_cluster_clean(cluster)
