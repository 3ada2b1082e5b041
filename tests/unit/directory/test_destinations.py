"""kv_directory/destinations.py, and the nonce check that uses it: the replica that recorded a
transfer checks its destination's ConsumeNonce without reading the record again; anyone else
is still refused, and a replica that did not record it reads the record as before."""

from __future__ import annotations

import asyncio
import time
import types

import grpc
import pytest

from kv_directory import destinations
from kv_directory.config import DirectoryConfig
from kv_directory.destinations import KnownDestinations
from kv_directory.memory_store import MemoryDirectoryStore
from kv_directory.server import DirectoryServicer
from pdserve_client.rpc.pd.v1 import directory_pb2
from tests.support.directory.grpc_process import manifest
from tests.support.directory.harness import register


def test_a_destination_is_taken_once():
    kept = KnownDestinations(60.0)
    kept.remember("t1", "decode-0")
    assert len(kept) == 1
    assert kept.take("t1") == "decode-0"
    assert kept.take("t1") is None and len(kept) == 0


def test_nothing_is_kept_without_a_lifetime():
    kept = KnownDestinations(0.0)
    kept.remember("t1", "decode-0")
    assert kept.take("t1") is None and len(kept) == 0


def test_an_entry_older_than_its_lifetime_is_not_used(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(destinations.time, "monotonic", lambda: now[0])
    kept = KnownDestinations(10.0)
    kept.remember("t1", "decode-0")
    now[0] += 10.5
    assert kept.take("t1") is None


def test_past_the_limit_the_oldest_go():
    kept = KnownDestinations(60.0, limit=2)
    for i in range(3):
        kept.remember(f"t{i}", f"decode-{i}")
    assert kept.take("t0") is None
    assert (kept.take("t1"), kept.take("t2")) == ("decode-1", "decode-2")


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
        assert not replay.consumed and store.lookups == reads + 1  # taken once: now the record is read
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
