"""Proto <-> dataclass conversion of the directory (kv_directory/convert.py), no processes."""

from __future__ import annotations

import dataclasses

import pytest

from kv_directory.config import DirectoryConfig
from kv_directory.convert import (
    fence,
    manifest_blob,
    manifest_from_blob,
    role_matches,
    spec_from_manifest,
    txn_response,
    txn_to_pb,
    worker_info_from_pb,
)
from kv_directory.memory_store import MemoryDirectoryStore
from pdserve_client.rpc.pd.v1 import common_pb2, directory_pb2, manifest_pb2
from runtime.directory.client import TxnRecord, TxnReply
from runtime.directory.records import (
    CAPACITY_FIELDS,
    LOAD_FIELDS,
    LoadReport,
    Transaction,
    WorkerCapacity,
    WorkerInfo,
    WorkerRecord,
    WorkerRole,
    chunk_list_digest,
)
from runtime.directory.states import Outcome, TxnState
from runtime.directory.wire import (
    OUTCOME_FROM_PB,
    OUTCOME_TO_PB,
    STATE_TO_PB,
    BadRequest,
    role_from_pb,
    worker_record_from_pb,
    worker_record_to_pb,
)


def make_manifest(**overrides) -> manifest_pb2.HandoffManifest:
    """A complete manifest from p0@1 to d0@1."""
    fields = dict(
        request_id="r1", tenant="acme", generation=1, attempt=0, prompt_digest="ab" * 32,
        token_interval=manifest_pb2.TokenInterval(start=0, end=32),
        cache_abi_digest="ef" * 32, block_size=16,
        expected_chunks=[manifest_pb2.ChunkSpec(layer=i, block_start=0, block_count=2, num_bytes=4096,
                                                checksum=f"c{i}") for i in range(2)],
        source_worker_id="p0", source_epoch=1, destination_worker_id="d0", destination_epoch=1,
        transfer_id="t1", reservation_id="res-1", route_epoch=0, checksum_algorithm="xxh3_64",
    )
    fields.update(overrides)
    return manifest_pb2.HandoffManifest(**fields)


def stored(manifest=None, state=TxnState.RESERVED) -> Transaction:
    """The Transaction a store would hold for ``manifest``."""
    return Transaction(spec_from_manifest(manifest or make_manifest()), state, "", 10, 20, 30)


# ---- enum and field maps -------------------------------------------------

def test_enum_maps_are_total_and_by_name():
    assert set(STATE_TO_PB) == set(TxnState)
    for s, pb in STATE_TO_PB.items():  # numbers differ (RELEASED/ABORTED), names agree
        assert manifest_pb2.TxnState.Name(pb) == f"TXN_STATE_{s.name}"
    assert set(OUTCOME_TO_PB) == set(Outcome)
    assert OUTCOME_TO_PB[Outcome.LEASE_LOST] == directory_pb2.TXN_OUTCOME_STALE_EPOCH
    assert {OUTCOME_FROM_PB[v] for v in OUTCOME_TO_PB.values()} == set(Outcome)
    assert role_from_pb(common_pb2.WORKER_ROLE_BOTH) == WorkerRole.MIXED


@pytest.mark.parametrize("bad", [common_pb2.WORKER_ROLE_UNSPECIFIED, 99])
def test_unknown_role_is_a_bad_request(bad):
    with pytest.raises(BadRequest, match="role"):
        role_from_pb(bad)


def test_dataclass_fields_match_proto_fields():
    # Must match: convert.py maps these by name, so a new proto field needs a dataclass field.
    assert CAPACITY_FIELDS == tuple(f.name for f in common_pb2.WorkerCapacity.DESCRIPTOR.fields)
    assert LOAD_FIELDS == tuple(f.name for f in common_pb2.LoadReport.DESCRIPTOR.fields)


def test_worker_round_trip():
    cap = WorkerCapacity(total_blocks=64, max_decode_batch=8, max_prefill_tokens=2048, block_size=16,
                         vocab_size=32000, max_model_len=4096)
    rec = WorkerRecord("d0", WorkerRole.MIXED, "h:1", "h:2", "abi", cap, LoadReport(1, 2, 3, 4, 64), 3, 12345,
                       colocated_only_reason="self-check failed")
    assert worker_record_from_pb(worker_record_to_pb(rec)) == rec
    req = directory_pb2.RegisterWorkerRequest(
        worker_id="d0", role=common_pb2.WORKER_ROLE_DECODE, grpc_address="h:1", data_plane_address="h:2",
        cache_abi_digest="abi", capacity=common_pb2.WorkerCapacity(total_blocks=64), colocated_only_reason="why")
    assert worker_info_from_pb(req) == WorkerInfo("d0", "decode", "h:1", "h:2", "abi", WorkerCapacity(64),
                                                  colocated_only_reason="why")
    with pytest.raises(BadRequest, match="worker_id"):
        worker_info_from_pb(directory_pb2.RegisterWorkerRequest(role=common_pb2.WORKER_ROLE_DECODE))


def test_role_filter_includes_mixed():
    assert role_matches(WorkerRole.MIXED, WorkerRole.DECODE)
    assert not role_matches(WorkerRole.PREFILL, WorkerRole.DECODE)
    assert role_matches(WorkerRole.PREFILL, None)


# ---- manifests -------------------------------------------------------------

def test_manifest_blob_is_canonical_and_round_trips():
    m = make_manifest()
    assert manifest_from_blob(manifest_blob(m)) == m
    # Field assignment order does not change the canonical text.
    other = manifest_pb2.HandoffManifest()
    other.transfer_id, other.request_id = "t1", "r1"
    other.MergeFrom(m)
    assert manifest_blob(other) == manifest_blob(m)
    assert manifest_from_blob("") == manifest_pb2.HandoffManifest()


def test_identity_digest_covers_every_manifest_field():
    base = spec_from_manifest(make_manifest())
    for change in [dict(attempt=1), dict(reservation_id="res-2"), dict(block_size=17),
                   dict(token_interval=manifest_pb2.TokenInterval(start=0, end=31)),
                   dict(expected_chunks=[manifest_pb2.ChunkSpec(layer=i, block_start=0, block_count=2,
                                                                num_bytes=4096, checksum="zz") for i in range(2)])]:
        assert spec_from_manifest(make_manifest(**change)).manifest_digest != base.manifest_digest, change
    assert spec_from_manifest(make_manifest()) == base
    assert base.chunks_digest == chunk_list_digest([(0, 0, 2, 4096), (1, 0, 2, 4096)])


def chunks(*layouts):
    return [manifest_pb2.ChunkSpec(layer=a, block_start=b, block_count=c, num_bytes=n) for a, b, c, n in layouts]


@pytest.mark.parametrize("change, why", [
    (dict(expected_chunks=chunks((1, 0, 2, 4096))), "layers"),                        # no layer 0
    (dict(expected_chunks=chunks((0, 0, 1, 2048), (1, 0, 2, 4096))), "layer 0"),      # short
    (dict(expected_chunks=chunks((0, 0, 2, 4096), (0, 1, 1, 2048), (1, 0, 2, 4096))), "twice"),
    (dict(expected_chunks=chunks((0, 0, 2, 4096), (1, 0, 2, 4000))), "bytes per block"),
    (dict(expected_chunks=chunks((0, 0, 2, 0), (1, 0, 2, 0))), "empty"),
    (dict(expected_chunks=[]), "no chunks"),                                          # tokens, no chunks
    (dict(token_interval=manifest_pb2.TokenInterval(start=8, end=32)), "block"),      # not aligned
    (dict(block_size=0), "block_size"),
])
def test_expected_chunks_must_tile_the_token_interval(change, why):
    with pytest.raises(BadRequest, match=why):
        spec_from_manifest(make_manifest(**change))


def test_an_empty_transfer_set_has_no_chunks():
    m = make_manifest(token_interval=manifest_pb2.TokenInterval(start=32, end=32), expected_chunks=[])
    assert spec_from_manifest(m).chunks_digest == chunk_list_digest([])


@pytest.mark.parametrize("field", ["transfer_id", "request_id", "tenant", "generation", "source_worker_id",
                                   "source_epoch", "destination_worker_id", "destination_epoch"])
def test_manifest_missing_field_names_it(field):
    m = make_manifest()
    m.ClearField(field)
    with pytest.raises(BadRequest, match=f"manifest.{field}"):
        spec_from_manifest(m)


def test_transaction_to_pb_and_back():
    m = make_manifest()
    rec = TxnRecord.from_pb(txn_to_pb(stored(m)))
    assert (rec.request_id, rec.transfer_id, rec.tenant, rec.generation) == ("r1", "t1", "acme", 1)
    assert (rec.state, rec.reservation_id, rec.chunks_expected) == (TxnState.RESERVED, "res-1", 2)
    assert (rec.source.worker_id, rec.dest.epoch, rec.created_unix_ms, rec.updated_unix_ms) == ("p0", 1, 10, 20)
    assert rec.manifest == m and rec.kv_digest == ""  # the source has declared none yet
    declared = dataclasses.replace(stored(m, TxnState.PUBLISHED), kv_digest="ab" * 16)
    assert txn_to_pb(declared).kv_digest == "ab" * 16


def test_txn_response_round_trip():
    reply = TxnReply.from_pb(txn_response(Outcome.LEASE_LOST, stored(state=TxnState.ABORTED), "r1", "t1"))
    assert (reply.outcome, reply.state, reply.current_generation) == (Outcome.LEASE_LOST, TxnState.ABORTED, 1)
    missing = TxnReply.from_pb(txn_response(Outcome.NOT_FOUND, None, "r1", "t9"))
    assert (missing.outcome, missing.state, missing.ok) == (Outcome.NOT_FOUND, None, False)


# ---- the fence -------------------------------------------------------------

@pytest.mark.parametrize("call, want", [
    (dict(), None),
    (dict(worker_id="p0"), None),                                      # the source, right epoch
    (dict(worker_id="router", worker_epoch=0), None),                  # not an end: not fenced
    (dict(request_id="other"), Outcome.CHECKSUM_CONFLICT),
    (dict(worker_epoch=2), Outcome.LEASE_LOST),                        # stale/other epoch of the dest
    (dict(worker_id="p0", worker_epoch=0), Outcome.LEASE_LOST),
    (dict(generation=2), Outcome.STALE_GENERATION),
    (dict(worker_id="p0", destination_only=True), Outcome.CHECKSUM_CONFLICT),  # publish by the source
])
def test_fence(call, want):
    args = dict(request_id="r1", generation=1, worker_id="d0", worker_epoch=1) | call
    assert fence(stored().spec, **args) == want


# ---- the store keeps what the wire needs (memory twin; Redis in integration) --

def test_memory_store_keeps_capacity_and_manifest():
    store = MemoryDirectoryStore(DirectoryConfig())
    cap = WorkerCapacity(total_blocks=64, block_size=16)
    p = store.register_worker(WorkerInfo("p0", "prefill", "p:1", "p:2", "abi", cap))
    d = store.register_worker(WorkerInfo("d0", "decode", "d:1", "d:2", "abi", cap))
    assert store.snapshot().worker("d0").capacity == cap
    m = make_manifest(source_epoch=p.epoch, destination_epoch=d.epoch)
    assert store.reserve(spec_from_manifest(m)).outcome == Outcome.APPLIED
    assert txn_to_pb(store.lookup("t1")).manifest == m
    changed = spec_from_manifest(make_manifest(source_epoch=p.epoch, destination_epoch=d.epoch, attempt=1))
    assert store.reserve(changed).outcome == Outcome.CHECKSUM_CONFLICT
    store.abort("t1", "cleanup")
    assert store.list_open() == []
