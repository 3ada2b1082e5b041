"""kv_directory/destinations.py, and the checks that use it: the replica that recorded a
transfer checks its destination's ConsumeNonce, and fences its transitions, without reading
the record again; anyone else is still refused, and a replica that did not record it reads
the record as before."""

from __future__ import annotations

import asyncio
import time
import types

import grpc
import pytest

from kv_directory import destinations
from kv_directory.config import DirectoryConfig
from kv_directory.destinations import KnownTransfers
from kv_directory.memory_store import MemoryDirectoryStore
from kv_directory.server import DirectoryServicer
from pdserve_client.rpc.pd.v1 import directory_pb2, manifest_pb2
from runtime.directory.records import TransferSpec, WorkerRef
from tests.support.directory.grpc_process import manifest
from tests.support.directory.harness import register


def _spec(tid: str = "t1", dest: str = "decode-0") -> TransferSpec:
    return TransferSpec(tid, "r1", "t", 1, WorkerRef("prefill-0", 1), WorkerRef(dest, 1), "m", "c",
                        manifest_blob="x" * 4096)


def test_an_identity_is_kept_without_its_manifest_until_forgotten():
    kept = KnownTransfers(60.0)
    kept.remember(_spec())
    assert len(kept) == 1
    got = kept.get("t1")
    assert got == _spec() and got.manifest_blob == ""  # the identity; the manifest is not part of it
    assert kept.get("t1") == got  # asked again (the nonce, then the Publish, then the Release)
    kept.forget("t1")
    assert kept.get("t1") is None and len(kept) == 0


def test_nothing_is_kept_without_a_lifetime():
    kept = KnownTransfers(0.0)
    kept.remember(_spec())
    assert kept.get("t1") is None and len(kept) == 0


def test_an_entry_older_than_its_lifetime_is_not_used(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(destinations.time, "monotonic", lambda: now[0])
    kept = KnownTransfers(10.0)
    kept.remember(_spec())
    now[0] += 9.5
    assert kept.get("t1") is not None
    now[0] += 1.0
    assert kept.get("t1") is None and len(kept) == 0


def test_past_the_limit_the_oldest_go():
    kept = KnownTransfers(60.0, limit=2)
    for i in range(3):
        kept.remember(_spec(f"t{i}", f"decode-{i}"))
    assert kept.get("t0") is None
    assert (kept.get("t1").dest.worker_id, kept.get("t2").dest.worker_id) == ("decode-1", "decode-2")


class Aborted(Exception):
    pass


class Context:
    """A call's context as the servicer reads it: the caller's certificate identity."""

    def __init__(self, identity: str):
        self.identity = identity
        self.code = None

    def peer_identities(self):
        return [b"pdserve://" + self.identity.encode()]

    async def abort(self, code, message):
        self.code = code
        raise Aborted(message)


class CountingStore(MemoryDirectoryStore):
    def __init__(self):
        super().__init__(DirectoryConfig())
        self.lookups = 0

    def lookup(self, transfer_id):
        self.lookups += 1
        return super().lookup(transfer_id)


def _servicer(store) -> DirectoryServicer:
    return DirectoryServicer(store, DirectoryConfig(), types.SimpleNamespace(secure=True))


def _nonce(tid: str) -> directory_pb2.ConsumeNonceRequest:
    return directory_pb2.ConsumeNonceRequest(nonce=f"n-{tid}", expires_unix_ms=int(time.time() * 1000) + 30_000,
                                             transfer_id=tid)


def _setup():
    store = CountingStore()
    p, d = register(store, "prefill-0", "prefill"), register(store, "decode-0", "decode")
    return store, _servicer(store), (p.worker_id, p.epoch), (d.worker_id, d.epoch)


def test_the_recording_replica_checks_the_destination_without_reading_the_record():
    async def main():
        store, servicer, src, dst = _setup()
        reply = await servicer.Reserve(directory_pb2.TxnReserveRequest(
            manifest=manifest(src, dst, "t1", "r1", cache_abi_digest="abi-1")), Context("router/router"))
        assert reply.outcome == directory_pb2.TXN_OUTCOME_APPLIED
        reads = store.lookups
        assert (await servicer.ConsumeNonce(_nonce("t1"), Context("decode/decode-0"))).consumed
        assert store.lookups == reads  # the kept destination: no read
        replay = await servicer.ConsumeNonce(_nonce("t1"), Context("decode/decode-0"))
        assert not replay.consumed and store.lookups == reads  # a replay is refused by the nonce, unread
    asyncio.run(main())


def test_anyone_but_the_destination_is_refused_and_the_destination_still_consumes():
    async def main():
        store, servicer, src, dst = _setup()
        await servicer.Reserve(directory_pb2.TxnReserveRequest(
            manifest=manifest(src, dst, "t1", "r1", cache_abi_digest="abi-1")), Context("router/router"))
        outsider = Context("decode/decode-9")
        with pytest.raises(Aborted, match="not the destination of transfer t1"):
            await servicer.ConsumeNonce(_nonce("t1"), outsider)
        assert outsider.code == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(Aborted, match="not the destination"):  # by the record as well
            await servicer.ConsumeNonce(_nonce("t1"), Context("decode/decode-9"))
        assert (await servicer.ConsumeNonce(_nonce("t1"), Context("decode/decode-0"))).consumed
    asyncio.run(main())


def test_a_replica_that_did_not_record_the_transfer_reads_the_record():
    async def main():
        store, recorder, src, dst = _setup()
        other = _servicer(store)
        assert (await other.ConsumeNonce(_nonce("t1"), Context("decode/decode-0"))).not_recorded
        await recorder.Reserve(directory_pb2.TxnReserveRequest(
            manifest=manifest(src, dst, "t1", "r1", cache_abi_digest="abi-1")), Context("router/router"))
        reads = store.lookups
        assert (await other.ConsumeNonce(_nonce("t1"), Context("decode/decode-0"))).consumed
        assert store.lookups == reads + 1
    asyncio.run(main())


# ---- a directory with the capability keys: the signed capability names the destination ----

def _minted(tid: str = "t1", destination: str = "decode-0", signing=None, issuer="router/router", **changes):
    from runtime.security.capability import PUSH, Grant, Signer
    from tests.support import pki
    grant = dict(tenant="t", source_worker_id="prefill-0", source_epoch=1, destination_worker_id=destination,
                 destination_epoch=1, transfer_id=tid, generation=1, route_epoch=0, cache_abi_digest="abi-1",
                 direction=PUSH, regions=(0, 1), max_bytes=4096, ttl_ms=30_000)
    return Signer.from_file(signing or pki.capability_keys()[0], issuer).mint(Grant(**{**grant, **changes}))


def _signed(minted, **fields) -> directory_pb2.ConsumeNonceRequest:
    """The ConsumeNonce a destination sends for `minted` (`fields` overriding what it says)."""
    request = dict(nonce=minted.nonce.hex(), expires_unix_ms=minted.expires_unix_ms, transfer_id="t1",
                   route_epoch=0, capability=minted.raw)
    return directory_pb2.ConsumeNonceRequest(**{**request, **fields})


def _keyed(store) -> DirectoryServicer:
    from runtime.security.capability import Verifier
    from tests.support import pki
    verifier = Verifier.from_file(pki.capability_keys()[1], ["router/router"], 300_000)
    return DirectoryServicer(store, DirectoryConfig(), types.SimpleNamespace(secure=True), verifier)


def test_with_the_keys_a_signed_capability_is_consumed_before_any_record_and_once():
    async def main():
        store = CountingStore()
        servicer, minted = _keyed(store), _minted()
        reply = await servicer.ConsumeNonce(_signed(minted), Context("decode/decode-0"))
        assert reply.consumed and not reply.not_recorded  # the router's Reserve has not come: no wait
        replay = await servicer.ConsumeNonce(_signed(minted), Context("decode/decode-0"))
        assert not replay.consumed and store.lookups == 0  # no record read, either time
    asyncio.run(main())


@pytest.mark.parametrize("who,fields,match", [
    ("decode/decode-9", {}, "decode-9 is not the destination of transfer t1"),
    ("decode/decode-0", {"transfer_id": "t2"}, "minted for transfer 't1'"),
    ("decode/decode-0", {"nonce": "00" * 16}, "minted for another nonce"),
    ("decode/decode-0", {"route_epoch": 7}, "route epoch 0 != 7"),
    ("decode/decode-0", {"expires_unix_ms": 1}, "expires at"),
    ("decode/decode-0", {"capability": b"\x00garbage"}, "capability denied: signature: unparseable"),
])
def test_with_the_keys_a_capability_for_another_caller_or_check_is_refused(who, fields, match):
    async def main():
        store = CountingStore()
        servicer, minted, context = _keyed(store), _minted(), Context(who)
        with pytest.raises(Aborted, match=match):
            await servicer.ConsumeNonce(_signed(minted, **fields), context)
        assert context.code == grpc.StatusCode.PERMISSION_DENIED
        # nothing was consumed: the destination's own check still goes through
        assert (await servicer.ConsumeNonce(_signed(minted), Context("decode/decode-0"))).consumed
    asyncio.run(main())


def test_with_the_keys_a_forged_untrusted_or_expired_capability_is_refused():
    from pdserve_client.rpc.pd.v1 import capability_pb2

    def forged(minted):
        signed = capability_pb2.SignedCapability.FromString(minted.raw)
        signed.signature = bytes(len(signed.signature))  # a known key id, a signature it did not make
        return types.SimpleNamespace(raw=signed.SerializeToString(), nonce=minted.nonce,
                                     expires_unix_ms=minted.expires_unix_ms)

    async def main():
        servicer = _keyed(CountingStore())
        for minted, match in ((forged(_minted()), "bad signature"),
                              (_minted(issuer="router/evil"), "untrusted issuer 'router/evil'"),
                              (_minted(ttl_ms=400_000), "expires in")):
            context = Context("decode/decode-0")
            with pytest.raises(Aborted, match=match):
                await servicer.ConsumeNonce(_signed(minted), context)
            assert context.code == grpc.StatusCode.PERMISSION_DENIED
    asyncio.run(main())


def test_with_the_keys_a_capability_under_a_key_not_loaded_here_falls_back_to_the_record(tmp_path):
    """A rotation under way: the router signs with a key this directory was started
    without. The record names the destination then, as it does without keys."""
    from runtime.security.capability import generate_signing_key
    generate_signing_key(tmp_path / "new.pem", tmp_path / "new.json")

    async def main():
        store, _, src, dst = _setup()
        servicer, minted = _keyed(store), _minted(signing=tmp_path / "new.pem")
        assert (await servicer.ConsumeNonce(_signed(minted), Context("decode/decode-0"))).not_recorded
        await servicer.Reserve(directory_pb2.TxnReserveRequest(
            manifest=manifest(src, dst, "t1", "r1", cache_abi_digest="abi-1")), Context("router/router"))
        with pytest.raises(Aborted, match="not the destination"):  # by the record
            await servicer.ConsumeNonce(_signed(minted), Context("decode/decode-9"))
        assert (await servicer.ConsumeNonce(_signed(minted), Context("decode/decode-0"))).consumed
    asyncio.run(main())


def test_without_the_keys_a_capability_is_not_enough_the_record_names_the_destination():
    async def main():
        store, servicer, src, dst = _setup()
        minted = _minted()
        assert (await servicer.ConsumeNonce(_signed(minted), Context("decode/decode-0"))).not_recorded
        await servicer.Reserve(directory_pb2.TxnReserveRequest(
            manifest=manifest(src, dst, "t1", "r1", cache_abi_digest="abi-1")), Context("router/router"))
        assert (await servicer.ConsumeNonce(_signed(minted), Context("decode/decode-0"))).consumed
    asyncio.run(main())


# ---- transitions on the kept identity: no record read, the same answers ----

def _sealed():
    """A transfer reserved by this replica, from a source that seals, to decode-0."""
    from runtime.directory.records import WorkerInfo
    from runtime.security.seal import Sealer
    store, sealer = CountingStore(), Sealer()
    p = store.register_worker(WorkerInfo("prefill-0", "prefill", "p:1", "p:2", "abi-1", seal_key=sealer.public))
    d = register(store, "decode-0", "decode")
    servicer = _servicer(store)
    m = manifest((p.worker_id, p.epoch), (d.worker_id, d.epoch), "t1", "r1", cache_abi_digest="abi-1")
    reply = asyncio.run(servicer.Reserve(directory_pb2.TxnReserveRequest(manifest=m), Context("router/router")))
    assert reply.outcome == directory_pb2.TXN_OUTCOME_APPLIED
    return store, servicer, sealer, p.epoch, d.epoch, m


def _publish(sealer, src_epoch, dst_epoch, m, generation=1, kv="kv" * 16, sealed_kv=None):
    from runtime.directory.wire import evidence_of
    chunks = list(m.expected_chunks)
    seal = sealer.seal("t1", 1, "prefill-0", src_epoch, evidence_of(sealed_kv or kv, chunks))
    return directory_pb2.TxnPublishRequest(request_id="r1", transfer_id="t1", generation=generation,
                                           destination_worker_id="decode-0", destination_epoch=dst_epoch,
                                           kv_digest=kv, chunks=chunks, source_seal=seal)


def _release(dst_epoch):
    return directory_pb2.TxnTransitionRequest(request_id="r1", transfer_id="t1", generation=1,
                                              worker_id="decode-0", worker_epoch=dst_epoch)


def test_the_recording_replica_publishes_and_releases_without_reading_the_record():
    store, servicer, sealer, src_epoch, dst_epoch, m = _sealed()
    reads, dest = store.lookups, Context("decode/decode-0")

    async def main():
        published = await servicer.Publish(_publish(sealer, src_epoch, dst_epoch, m), dest)
        assert (published.outcome, published.state) == (directory_pb2.TXN_OUTCOME_APPLIED,
                                                         manifest_pb2.TXN_STATE_PUBLISHED)
        released = await servicer.Release(_release(dst_epoch), dest)
        assert (released.outcome, released.state) == (directory_pb2.TXN_OUTCOME_APPLIED,
                                                      manifest_pb2.TXN_STATE_RELEASED)
        assert store.lookups == reads  # both on the kept identity
        again = await servicer.Release(_release(dst_epoch), dest)  # ended: forgotten, the record read
        assert again.outcome == directory_pb2.TXN_OUTCOME_DUPLICATE and store.lookups == reads + 1
    asyncio.run(main())


def test_a_seal_that_does_not_open_on_the_kept_identity_is_judged_on_the_record():
    store, servicer, sealer, src_epoch, dst_epoch, m = _sealed()
    refused, reads = [], store.lookups
    servicer.metrics.seal_refused = refused.append

    async def main():
        forged = _publish(sealer, src_epoch, dst_epoch, m, sealed_kv="ff" * 16)  # sealed over other K/V
        reply = await servicer.Publish(forged, Context("decode/decode-0"))
        assert (reply.outcome, reply.state) == (directory_pb2.TXN_OUTCOME_CHECKSUM_CONFLICT,
                                                manifest_pb2.TXN_STATE_RESERVED)
        assert store.lookups == reads + 1 and refused == ["not_opened"]  # judged once, counted once
        ok = await servicer.Publish(_publish(sealer, src_epoch, dst_epoch, m), Context("decode/decode-0"))
        assert ok.outcome == directory_pb2.TXN_OUTCOME_APPLIED  # nothing moved: the real one still publishes
    asyncio.run(main())


@pytest.mark.parametrize("change,outcome", [
    (dict(generation=2), directory_pb2.TXN_OUTCOME_STALE_GENERATION),
    (dict(dst_epoch=99), directory_pb2.TXN_OUTCOME_STALE_EPOCH),
])
def test_a_fenced_publish_on_the_kept_identity_reports_the_state_from_the_record(change, outcome):
    store, servicer, sealer, src_epoch, dst_epoch, m = _sealed()
    reads = store.lookups
    request = _publish(sealer, src_epoch, change.get("dst_epoch", dst_epoch), m,
                       generation=change.get("generation", 1))
    reply = asyncio.run(servicer.Publish(request, Context("decode/decode-0")))
    assert (reply.outcome, reply.state) == (outcome, manifest_pb2.TXN_STATE_RESERVED)
    assert store.lookups == reads + 1
    assert store.lookup("t1").state.name == "RESERVED"


def test_an_outsider_is_refused_on_the_kept_identity_and_moves_nothing():
    store, servicer, sealer, src_epoch, dst_epoch, m = _sealed()
    reads, outsider = store.lookups, Context("decode/decode-9")
    request = _publish(sealer, src_epoch, dst_epoch, m)
    request.destination_worker_id = "decode-9"  # as itself: its certificate's name
    with pytest.raises(Aborted, match="decode-9 is not the destination of transfer t1"):
        asyncio.run(servicer.Publish(request, outsider))
    assert outsider.code == grpc.StatusCode.PERMISSION_DENIED and store.lookups == reads
    release = _release(dst_epoch)
    release.worker_id = "prefill-7"
    with pytest.raises(Aborted, match="prefill-7 is not the source or destination of transfer t1"):
        asyncio.run(servicer.Release(release, Context("prefill/prefill-7")))
    assert store.lookup("t1").state.name == "RESERVED"
