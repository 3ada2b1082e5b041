"""pd.v1 protobuf <-> the directory's records: one mapping for both ends of the wire
(the directory service and its client), so they cannot disagree.

Mappings that are *not* by number (the enums were numbered independently):

* ``TxnState``: store RELEASED=5/ABORTED=6, proto ABORTED=5/RELEASED=6 — mapped by name.
* ``Outcome.LEASE_LOST`` is ``TXN_OUTCOME_STALE_EPOCH`` on the wire.
* ``WorkerRole.MIXED`` is ``WORKER_ROLE_BOTH`` on the wire.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from pdserve_client.rpc.pd.v1 import common_pb2, directory_pb2, manifest_pb2
from runtime.directory.chunk_plan import Layout
from runtime.directory.cost_profile import PROFILE_FIELDS, CostProfile
from runtime.directory.records import (
    CAPACITY_FIELDS,
    LOAD_FIELDS,
    LoadReport,
    WorkerCapacity,
    WorkerRecord,
    WorkerRole,
    chunk_sums_digest,
    evidence,
)
from runtime.directory.states import Outcome, TxnState


class BadRequest(ValueError):
    """A request field is missing or malformed; the servicer answers INVALID_ARGUMENT."""


ROLE_TO_PB: dict[WorkerRole, int] = {
    WorkerRole.PREFILL: common_pb2.WORKER_ROLE_PREFILL,
    WorkerRole.DECODE: common_pb2.WORKER_ROLE_DECODE,
    WorkerRole.MIXED: common_pb2.WORKER_ROLE_BOTH,
}
ROLE_FROM_PB: dict[int, WorkerRole] = {v: k for k, v in ROLE_TO_PB.items()}

STATE_TO_PB: dict[TxnState, int] = {s: manifest_pb2.TxnState.Value(f"TXN_STATE_{s.name}") for s in TxnState}
STATE_FROM_PB: dict[int, TxnState] = {v: k for k, v in STATE_TO_PB.items()}

_OUTCOME_PB_NAME = {o: o.name for o in Outcome} | {Outcome.LEASE_LOST: "STALE_EPOCH"}
OUTCOME_TO_PB: dict[Outcome, int] = {
    o: directory_pb2.TxnOutcome.Value(f"TXN_OUTCOME_{name}") for o, name in _OUTCOME_PB_NAME.items()
}
OUTCOME_FROM_PB: dict[int, Outcome] = {v: k for k, v in OUTCOME_TO_PB.items()}


def require(value: object, field: str) -> None:
    """BadRequest naming ``field`` unless ``value`` is truthy (non-empty, non-zero)."""
    if not value:
        raise BadRequest(f"{field} is required (empty or zero)")


def role_from_pb(role: int, field: str = "role") -> WorkerRole:
    """Proto WorkerRole -> store role; UNSPECIFIED or an unknown number is a BadRequest."""
    try:
        return ROLE_FROM_PB[role]
    except KeyError:
        raise BadRequest(f"{field} must be PREFILL, DECODE or BOTH, got {role}") from None


# ---- workers ---------------------------------------------------------------

def load_from_pb(pb: common_pb2.LoadReport) -> LoadReport:
    """LoadReport proto -> dataclass (fields map by name)."""
    return LoadReport(**{f: getattr(pb, f) for f in LOAD_FIELDS})


def load_to_pb(load: LoadReport) -> common_pb2.LoadReport:
    """LoadReport dataclass -> proto."""
    return common_pb2.LoadReport(**dataclasses.asdict(load))


def capacity_from_pb(pb: common_pb2.WorkerCapacity) -> WorkerCapacity:
    """WorkerCapacity proto -> dataclass (fields map by name)."""
    return WorkerCapacity(**{f: getattr(pb, f) for f in CAPACITY_FIELDS})


def capacity_to_pb(cap: WorkerCapacity) -> common_pb2.WorkerCapacity:
    """WorkerCapacity dataclass -> proto."""
    return common_pb2.WorkerCapacity(**dataclasses.asdict(cap))


def profile_from_pb(pb: common_pb2.CostProfile) -> CostProfile:
    """CostProfile proto -> dataclass; BadRequest on a negative or non-finite number."""
    try:
        return CostProfile(**{f: getattr(pb, f) for f in PROFILE_FIELDS})
    except ValueError as e:
        raise BadRequest(f"profile: {e}") from None


def profile_to_pb(profile: CostProfile) -> common_pb2.CostProfile:
    """CostProfile dataclass -> proto."""
    return common_pb2.CostProfile(**dataclasses.asdict(profile))


def worker_record_to_pb(rec: WorkerRecord) -> common_pb2.WorkerInfo:
    """A live worker as ClusterSnapshot reports it."""
    return common_pb2.WorkerInfo(
        worker_id=rec.worker_id, role=ROLE_TO_PB[rec.role], grpc_address=rec.grpc_address,
        data_plane_address=rec.data_plane_address, cache_abi_digest=rec.cache_abi_digest,
        capacity=capacity_to_pb(rec.capacity), epoch=rec.epoch, load=load_to_pb(rec.load),
        lease_expires_unix_ms=rec.lease_expiry_ms, profile=profile_to_pb(rec.profile),
        colocated_only_reason=rec.colocated_only_reason, model_identity=rec.model_identity,
        seal_key=rec.seal_key, load_reported_unix_ms=rec.load_reported_ms,
    )


def worker_record_from_pb(pb: common_pb2.WorkerInfo) -> WorkerRecord:
    """ClusterSnapshot entry -> WorkerRecord (the client's view of a live worker)."""
    return WorkerRecord(
        pb.worker_id, ROLE_FROM_PB[pb.role], pb.grpc_address, pb.data_plane_address,
        pb.cache_abi_digest, capacity_from_pb(pb.capacity), load_from_pb(pb.load), pb.epoch,
        pb.lease_expires_unix_ms, profile_from_pb(pb.profile), pb.colocated_only_reason, pb.model_identity,
        pb.seal_key, pb.load_reported_unix_ms,
    )


def chunk_layouts(chunks: Iterable[manifest_pb2.ChunkSpec]) -> list[Layout]:
    """ChunkSpecs -> (layer, block_start, block_count, num_bytes), in list order."""
    return [(c.layer, c.block_start, c.block_count, c.num_bytes) for c in chunks]


def chunk_specs(chunks: Iterable) -> list[manifest_pb2.ChunkSpec]:
    """Chunks as sent or as arrived (anything with .key, .num_bytes, .checksum) -> ChunkSpecs,
    in order: what the destination reports with Publish (and a source declaring with Begin)."""
    return [manifest_pb2.ChunkSpec(layer=c.key.layer, block_start=c.key.block_start, block_count=c.key.block_count,
                                   num_bytes=c.num_bytes, checksum=c.checksum) for c in chunks]


def chunk_sums(chunks: Iterable[manifest_pb2.ChunkSpec]) -> list[tuple[int, int, int, int, str]]:
    """ChunkSpecs -> (layer, block_start, block_count, num_bytes, checksum), in list order."""
    return [(c.layer, c.block_start, c.block_count, c.num_bytes, c.checksum) for c in chunks]


def evidence_of(kv_digest: str, chunks: Iterable) -> str:
    """The evidence string (records.evidence) of a K/V digest and a chunk list in manifest
    order: ChunkSpecs, or the source's Chunks as sent (runtime/transfer/base.py `Chunk.row`).
    The source seals it, the directory compares and keeps it."""
    return evidence(kv_digest, chunk_sums_digest(
        (c.layer, c.block_start, c.block_count, c.num_bytes, c.checksum) if isinstance(c, manifest_pb2.ChunkSpec)
        else c.row for c in chunks))
