"""The Directory gRPC service as a real process (``python -m kv_directory``) on a
real redis-server, driven through ``DirectoryClient`` with mutual TLS on: every call
goes out under the certificate its caller would hold (``Callers``: the router reserves
and reads, each worker registers and moves transactions as itself). Its liveness (leases,
Redis down, readiness, leaving): test_directory_liveness.py.

Every test ends with a leak check: no open transaction is left behind.
"""

from __future__ import annotations

import time
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from pdserve_client.rpc.pd.v1 import common_pb2, directory_pb2, directory_pb2_grpc, manifest_pb2
from runtime.directory.client import NonceRefused, TransferNotRecorded
from runtime.directory.records import LoadReport, WorkerInfo, WorkerRole
from runtime.directory.states import Outcome, TxnState
from tests.support import pki
from tests.support.directory.grpc_process import (
    CAP,
    KV_DIGEST,
    RECEIVED,
    SERVICE,
    Callers,
    DirectoryProcess,
    drive_to,
    manifest,
    run,
    two_workers,
    uid,
)

# ---- service surface -------------------------------------------------------

def test_health_and_reflection(directory):
    with pki.security("router", "router").channel(directory.address, "directory") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                            timeout=2)
        names = {s.name for r in replies for s in r.list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health"} <= names


# ---- registry --------------------------------------------------------------

def test_register_heartbeat_snapshot(directory):
    async def scenario(client: Callers):
        (p, ep), (d, ed) = await two_workers(client)
        m = uid("m")
        reg = await client.register_worker(WorkerInfo(m, "mixed", f"{m}:1", f"{m}:2", "abi", CAP))
        assert ep >= 1 and ed >= 1 and reg.epoch >= 1 and reg.lease_ttl_ms == 10_000

        load = LoadReport(pending_prefill_tokens=100, active_decode_batch=3, free_blocks=40,
                          reserved_blocks=8, total_blocks=64)
        lease = await client.heartbeat(d, ed, load)
        assert lease.ok and lease.lease_ttl_ms == 10_000
        assert not (await client.heartbeat(d, ed + 1, load)).ok  # not the live epoch

        snap = await client.snapshot()
        w = snap.worker(d)
        assert (w.role, w.grpc_address, w.data_plane_address, w.cache_abi_digest, w.epoch) == \
            (WorkerRole.DECODE, f"{d}:1", f"{d}:2", "abi", ed)
        assert (w.capacity, w.load) == (CAP, load)
        assert w.lease_expiry_ms > snap.now_ms > time.time() * 1000 - 60_000
        assert 0 < snap.worker(p).load_reported_ms <= w.load_reported_ms <= snap.now_ms  # reports dated
        assert snap.worker(p).load == LoadReport(free_blocks=64, total_blocks=64)  # registered, no heartbeat yet
        decode_side = {w.worker_id for w in (await client.snapshot(WorkerRole.DECODE)).workers}
        assert {d, m} <= decode_side and p not in decode_side
        prefill_side = {w.worker_id for w in (await client.snapshot(WorkerRole.PREFILL)).workers}
        assert {p, m} <= prefill_side and d not in prefill_side

        again = await client.register_worker(WorkerInfo(d, "decode", f"{d}:1", f"{d}:2", "abi", CAP))
        assert again.epoch > ed
        assert not (await client.heartbeat(d, ed, load)).ok  # the old incarnation is fenced

    run(directory.address, scenario)


# ---- transactions ----------------------------------------------------------

def test_full_lifecycle(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, tid = uid("r"), uid("t")
        m = manifest(src, dst, tid, rid)
        r = await client.reserve(m)
        assert (r.outcome, r.state, r.current_generation) == (Outcome.APPLIED, TxnState.RESERVED, 1)
        assert [t.transfer_id for t in await client.list_open(dst[0])] == [tid]
        await drive_to(client, rid, tid, 1, src, dst, TxnState.PUBLISHED)
        again = await client.publish(rid, tid, 1, *dst, kv_digest=KV_DIGEST)
        assert (again.outcome, again.state) == (Outcome.DUPLICATE, TxnState.PUBLISHED)
        released = await client.release(rid, tid, 1, *src)
        assert (released.outcome, released.state) == (Outcome.APPLIED, TxnState.RELEASED)

        rec = await client.lookup(rid, tid)
        assert rec.state == TxnState.RELEASED and rec.manifest == m
        assert (rec.kv_digest, rec.chunks_expected, rec.reservation_id) == (KV_DIGEST, 3, f"res-{tid}")
        assert (rec.source.worker_id, rec.dest.epoch) == (src[0], dst[1])
        assert await client.lookup("another-request", tid) is None
        assert await client.lookup(rid, "no-such-transfer") is None

    run(directory.address, scenario)


def test_illegal_and_fenced_transitions(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, tid = uid("r"), uid("t")
        await client.reserve(manifest(src, dst, tid, rid))

        async def outcome(call) -> Outcome:
            r = await call
            assert r.state == TxnState.RESERVED  # a rejection changes nothing
            return r.outcome

        assert await outcome(client.publish(rid, tid, 1, *dst, KV_DIGEST)) == Outcome.ILLEGAL_TRANSITION
        assert await outcome(client.release(rid, tid, 1, *src)) == Outcome.ILLEGAL_TRANSITION
        assert await outcome(client.begin(rid, tid, 1, src[0], src[1] + 1)) == Outcome.LEASE_LOST  # STALE_EPOCH
        assert await outcome(client.begin(rid, tid, 2, *src)) == Outcome.STALE_GENERATION
        assert await outcome(client.begin("other", tid, 1, *src)) == Outcome.CHECKSUM_CONFLICT
        assert (await client.begin(rid, "no-such", 1, *src)).outcome == Outcome.NOT_FOUND

        async def denied(call, state: TxnState) -> None:
            """The wrong end moving it: refused by certificate, nothing changed."""
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert (await client.lookup(rid, tid)).state == state

        await denied(client.begin(rid, tid, 1, *dst), TxnState.RESERVED)  # only the source begins

        await drive_to(client, rid, tid, 1, src, dst, TxnState.TRANSFERRING)
        await denied(client.validated(rid, tid, 1, *src, KV_DIGEST, RECEIVED), TxnState.TRANSFERRING)
        await drive_to(client, rid, tid, 1, src, dst, TxnState.VALIDATED, start=TxnState.TRANSFERRING)
        await denied(client.publish(rid, tid, 1, *src, kv_digest=KV_DIGEST), TxnState.VALIDATED)

        aborted = await client.abort(rid, tid, 1, "router-0", 0, reason="client gone")  # the router: allowed
        assert (aborted.outcome, aborted.state) == (Outcome.APPLIED, TxnState.ABORTED)
        assert (await client.abort(rid, tid, 1, *dst)).outcome == Outcome.DUPLICATE
        late = await client.publish(rid, tid, 1, *dst, kv_digest=KV_DIGEST)
        assert (late.outcome, late.state) == (Outcome.ILLEGAL_TRANSITION, TxnState.ABORTED)
        assert (await client.lookup(rid, tid)).abort_reason == "client gone"

    run(directory.address, scenario)


def test_a_wrong_kv_digest_or_a_partial_chunk_list_is_refused_at_the_directory(directory):
    """The directory is the judge of a hand-off's bytes: VALIDATED needs the
    destination's K/V digest to be the one the source declared, and the chunks it
    received to be exactly the manifest's expected list."""
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, tid = uid("r"), uid("t")
        await client.reserve(manifest(src, dst, tid, rid))
        assert (await client.begin(rid, tid, 1, *src)).state == TxnState.TRANSFERRING  # no digest yet
        undeclared = await client.validated(rid, tid, 1, *dst, KV_DIGEST, RECEIVED)
        assert (undeclared.outcome, undeclared.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        assert (await client.begin(rid, tid, 1, *src, kv_digest=KV_DIGEST)).outcome == Outcome.APPLIED
        redeclared = await client.begin(rid, tid, 1, *src, kv_digest="cd" * 16)
        assert redeclared.outcome == Outcome.CHECKSUM_CONFLICT  # declared once
        with pytest.raises(ValueError, match="chunks"):  # a digest comes with its chunk list
            await client.begin(rid, tid, 1, *src, kv_digest=KV_DIGEST, chunks=())

        wrong = await client.validated(rid, tid, 1, *dst, "cd" * 16, RECEIVED)
        assert (wrong.outcome, wrong.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        for partial in (RECEIVED[:2], RECEIVED[::-1], RECEIVED + RECEIVED[:1]):
            r = await client.validated(rid, tid, 1, *dst, KV_DIGEST, partial)
            assert (r.outcome, r.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        bigger = [manifest_pb2.ChunkSpec(layer=c.layer, block_count=3, num_bytes=2048) for c in RECEIVED]
        r = await client.validated(rid, tid, 1, *dst, KV_DIGEST, bigger)
        assert r.outcome == Outcome.CHECKSUM_CONFLICT
        assert (await client.lookup(rid, tid)).state == TxnState.TRANSFERRING  # nothing changed

        flipped = [manifest_pb2.ChunkSpec(layer=c.layer, block_count=3, num_bytes=1024, checksum=c.checksum + "x")
                   for c in RECEIVED]  # the layout is right, a checksum is not the source's
        r = await client.validated(rid, tid, 1, *dst, KV_DIGEST, flipped)
        assert (r.outcome, r.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)

        right = await client.validated(rid, tid, 1, *dst, KV_DIGEST, RECEIVED)
        assert (right.outcome, right.state) == (Outcome.APPLIED, TxnState.VALIDATED)
        other = await client.publish(rid, tid, 1, *dst, "cd" * 16)
        assert (other.outcome, other.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.VALIDATED)
        with pytest.raises(ValueError, match="kv_digest"):
            await client.publish(rid, tid, 1, *dst, "")
        assert (await client.publish(rid, tid, 1, *dst, KV_DIGEST)).state == TxnState.PUBLISHED
        assert (await client.lookup(rid, tid)).kv_digest == KV_DIGEST
        assert (await client.release(rid, tid, 1, *dst)).ok

    run(directory.address, scenario)


def test_publish_with_the_received_chunks_validates_and_publishes_in_one_call(directory):
    """The destination's one round trip: Publish with its chunk list judges as Validated
    does, then publishes; the first refusal is the answer. Only the destination may."""
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, tid = uid("r"), uid("t")
        await client.reserve(manifest(src, dst, tid, rid))
        await client.begin(rid, tid, 1, *src, kv_digest=KV_DIGEST, chunks=RECEIVED)
        wrong = await client.publish(rid, tid, 1, *dst, "cd" * 16, RECEIVED)
        assert (wrong.outcome, wrong.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        partial = await client.publish(rid, tid, 1, *dst, KV_DIGEST, RECEIVED[:2])
        assert (partial.outcome, partial.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        with pytest.raises(grpc.aio.AioRpcError) as err:  # the source may not publish
            await client.publish(rid, tid, 1, *src, KV_DIGEST, RECEIVED)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert (await client.lookup(rid, tid)).state == TxnState.TRANSFERRING
        both = await client.publish(rid, tid, 1, *dst, KV_DIGEST, RECEIVED)
        assert (both.outcome, both.state) == (Outcome.APPLIED, TxnState.PUBLISHED)
        assert (await client.publish(rid, tid, 1, *dst, KV_DIGEST, RECEIVED)).outcome == Outcome.DUPLICATE
        assert (await client.release(rid, tid, 1, *dst)).ok

    run(directory.address, scenario)


def test_a_manifest_whose_chunks_do_not_tile_its_interval_is_invalid(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        with pytest.raises(ValueError, match="expected_chunks do not tile"):
            await client.reserve(manifest(src, dst, uid("t"), uid("r"), end=64))
        assert await client.list_open(dst[0]) == []

    run(directory.address, scenario)


def test_stale_generation_publish(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, t1, t2, t3 = uid("r"), uid("t1"), uid("t2"), uid("t3")
        await client.reserve(manifest(src, dst, t1, rid, gen=1))
        await drive_to(client, rid, t1, 1, src, dst, TxnState.VALIDATED)
        # Reroute: generation 2 supersedes the unpublished generation 1.
        assert (await client.reserve(manifest(src, dst, t2, rid, gen=2))).outcome == Outcome.APPLIED
        old = await client.lookup(rid, t1)
        assert (old.state, old.abort_reason) == (TxnState.ABORTED, "superseded")
        late = await client.publish(rid, t1, 1, *dst, kv_digest=KV_DIGEST)
        assert (late.outcome, late.state) == (Outcome.STALE_GENERATION, TxnState.ABORTED)
        stale = await client.reserve(manifest(src, dst, t3, rid, gen=1))
        assert (stale.outcome, stale.state) == (Outcome.STALE_GENERATION, None)
        await drive_to(client, rid, t2, 2, src, dst, TxnState.PUBLISHED)
        assert (await client.release(rid, t2, 2, *src)).ok

    run(directory.address, scenario)


def test_duplicate_transfer_id_and_conflicting_checksum(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, tid = uid("r"), uid("t")
        m = manifest(src, dst, tid, rid)
        assert (await client.reserve(m)).outcome == Outcome.APPLIED
        dup = await client.reserve(m)
        assert (dup.outcome, dup.state) == (Outcome.DUPLICATE, TxnState.RESERVED)
        conflict = await client.reserve(manifest(src, dst, tid, rid, checksums=["c0", "XX", "c2"]))
        assert (conflict.outcome, conflict.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.RESERVED)
        other_attempt = await client.reserve(manifest(src, dst, tid, rid, attempt=1))
        assert other_attempt.outcome == Outcome.CHECKSUM_CONFLICT
        assert (await client.lookup(rid, tid)).manifest == m  # the original is kept
        assert (await client.abort(rid, tid, 1, *dst, reason="test done")).ok

    run(directory.address, scenario)


def test_list_open_by_worker(directory):
    async def scenario(client: Callers):
        (p, ep), d1 = await two_workers(client)
        _, d2 = await two_workers(client)
        r1, r2, t1, t2 = uid("r"), uid("r"), uid("t"), uid("t")
        await client.reserve(manifest((p, ep), d1, t1, r1))
        await client.reserve(manifest((p, ep), d2, t2, r2))
        assert [t.transfer_id for t in await client.list_open(p)] == sorted([t1, t2])
        assert [t.transfer_id for t in await client.list_open(d2[0])] == [t2]
        assert {t1, t2} <= {t.transfer_id for t in await client.list_open()}
        for rid, tid, dst in ((r1, t1, d1), (r2, t2, d2)):
            assert (await client.abort(rid, tid, 1, *dst, reason="cleanup")).ok

    run(directory.address, scenario)


# ---- prefix index, route epoch, nonces -------------------------------------


def test_route_epoch_and_nonce(directory):
    async def scenario(client: Callers):
        before = await client.get_route_epoch()
        adv = await client.advance_route_epoch(reason="test")
        assert adv.advanced and adv.route_epoch > before
        first = adv.route_epoch
        second = await client.advance_route_epoch(expected=first)
        assert second.advanced and second.route_epoch > first
        # expected is never 0 here (0 means unconditional on the wire).
        stale = await client.advance_route_epoch(expected=first, reason="lost race")
        assert (stale.route_epoch, stale.advanced) == (second.route_epoch, False)
        assert await client.get_route_epoch() == second.route_epoch

        src, dst = await two_workers(client)
        old = await client.reserve(manifest(src, dst, uid("t"), uid("r"), route_epoch=first))
        assert old.outcome == Outcome.STALE_GENERATION  # routed under a superseded epoch

        # A nonce is consumed by the destination of the transfer its capability names; before
        # the router recorded that transfer the answer is "not recorded", and nothing is burned.
        rid, tid = uid("r"), uid("t")
        nonce, expires_ms = uuid.uuid4().hex, int(time.time() * 1000) + 30_000
        with pytest.raises(TransferNotRecorded, match=tid):
            await client.worker(dst[0]).consume_nonce(nonce, expires_ms, transfer_id=tid)
        assert (await client.reserve(manifest(src, dst, tid, rid))).ok
        with pytest.raises(NonceRefused, match="not the destination"):  # another decode may not
            await client.as_("decode", "decode-other").consume_nonce(nonce, expires_ms, transfer_id=tid)
        assert await client.worker(dst[0]).consume_nonce(nonce, expires_ms, transfer_id=tid)
        assert not await client.worker(dst[0]).consume_nonce(nonce, expires_ms, transfer_id=tid)  # replay
        assert (await client.abort(rid, tid, 1, *dst, reason="test done")).ok

    run(directory.address, scenario)


def test_a_directory_with_the_capability_keys_lets_the_destination_consume_before_the_record(redis_server):
    """With PD_CAPABILITY_PUBLIC_KEYS the destination's ConsumeNonce carries the router-signed
    capability: no record is needed (no "not recorded", nothing asked again), only the
    destination it names consumes, once; a key set it cannot read stops it at start (2)."""
    from runtime.security.capability import PUSH, Grant, Signer
    signing, public = pki.capability_keys()
    keyed = DirectoryProcess(redis_server.url, PD_CAPABILITY_PUBLIC_KEYS=str(public))
    try:
        async def scenario(client: Callers):
            minted = Signer.from_file(signing, "router/router").mint(Grant(
                tenant="t", source_worker_id="prefill-0", source_epoch=1, destination_worker_id="decode-0",
                destination_epoch=1, transfer_id="t/1", generation=1, route_epoch=0, cache_abi_digest="abi",
                direction=PUSH, regions=(0,), max_bytes=1024, ttl_ms=30_000))
            ask = dict(nonce=minted.nonce.hex(), expires_unix_ms=minted.expires_unix_ms, transfer_id="t/1",
                       capability=minted.raw)
            with pytest.raises(NonceRefused, match="decode-9 is not the destination of transfer t/1"):
                await client.as_("decode", "decode-9").consume_nonce(**ask)
            assert await client.as_("decode", "decode-0").consume_nonce(**ask)  # no record of t/1 anywhere
            assert not await client.as_("decode", "decode-0").consume_nonce(**ask)  # replay
        run(keyed.address, scenario)
        assert "nonce destinations by capability" in keyed.output()
    finally:
        assert keyed.stop() == 0, keyed.output()
    with pytest.raises(RuntimeError, match="exited 2"):
        DirectoryProcess(redis_server.url, PD_CAPABILITY_PUBLIC_KEYS=str(public) + ".missing")


# ---- bad input --------------------------------------------------------------

def test_bad_input_is_invalid_argument(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        with pytest.raises(ValueError, match="manifest.transfer_id"):
            await client.reserve(manifest(src, dst, "", uid("r")))
        with pytest.raises(ValueError, match="manifest.generation"):
            await client.reserve(manifest(src, dst, uid("t"), uid("r"), gen=0))
        with pytest.raises(ValueError, match="generation"):
            await client.begin(uid("r"), uid("t"), 0, *dst)
        with pytest.raises(ValueError, match="worker_id"):
            await client.begin(uid("r"), uid("t"), 1, "", 1)
        with pytest.raises(ValueError, match="request_id"):
            await client.abort("", uid("t"), 1, *dst)
        with pytest.raises(ValueError, match="transfer_id"):
            await client.lookup(uid("r"), "")
        with pytest.raises(ValueError, match="epoch"):
            await client.heartbeat(dst[0], 0)
        with pytest.raises(ValueError, match="expires_unix_ms"):
            await client.worker(dst[0]).consume_nonce("n", 0)

        # Enum values the client cannot send, straight through the stub (as callers the
        # methods admit: a worker registering itself, the router reading).
        worker, router = (pki.security(role, name).aio_channel(client.address, "directory")
                          for role, name in (("decode", "w"), ("router", "router")))
        async with worker, router:
            for call, request in [
                (directory_pb2_grpc.DirectoryStub(worker).RegisterWorker,
                 directory_pb2.RegisterWorkerRequest(worker_id="w")),  # role unset
                (directory_pb2_grpc.DirectoryStub(worker).RegisterWorker,
                 directory_pb2.RegisterWorkerRequest(worker_id="w", role=42)),
                (directory_pb2_grpc.DirectoryStub(router).ClusterSnapshot,
                 directory_pb2.ClusterSnapshotRequest(role=42)),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call(request, timeout=5)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "role" in err.value.details()
            # A seal key that is not an Ed25519 public key's 32 raw bytes.
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await directory_pb2_grpc.DirectoryStub(worker).RegisterWorker(directory_pb2.RegisterWorkerRequest(
                    worker_id="w", role=common_pb2.WORKER_ROLE_DECODE, seal_key=b"\0" * 31), timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "seal_key is 32 raw bytes" in err.value.details()

    run(directory.address, scenario)
