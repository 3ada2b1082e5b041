"""pd.v1 protobuf <-> directory dataclasses, and the checks a request gets before the store.

Pure functions, no gRPC and no Redis: the servicer (``server.py``) and the
client (``client.py``) both convert through here, so the two ends of the wire
cannot disagree on a mapping.

Mappings that are *not* by number (the enums were numbered independently):

* ``TxnState``: store RELEASED=5/ABORTED=6, proto ABORTED=5/RELEASED=6 — mapped by name.
* ``Outcome.LEASE_LOST`` is ``TXN_OUTCOME_STALE_EPOCH`` on the wire.
* ``WorkerRole.MIXED`` is ``WORKER_ROLE_BOTH`` on the wire.

The manifest is stored with its transaction as canonical JSON
(``manifest_blob``); the transaction's identity digest is the sha256 of that
text, so a retry by transfer id is DUPLICATE only if *every* manifest field is
equal, and CHECKSUM_CONFLICT otherwise (article 0x06A).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from google.protobuf import json_format

from kv_directory.profile import PROFILE_FIELDS, CostProfile
from kv_directory.states import Outcome, TxnState
from kv_directory.store import (
    CAPACITY_FIELDS,
    LOAD_FIELDS,
    LoadReport,
    Transaction,
    TransferSpec,
    WorkerCapacity,
    WorkerInfo,
    WorkerRecord,
    WorkerRef,
    WorkerRole,
    digest_checksums,
    normalize_hashes,
)
from services.rpc.pd.v1 import common_pb2, directory_pb2, manifest_pb2


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


def worker_info_from_pb(req: directory_pb2.RegisterWorkerRequest) -> WorkerInfo:
    """RegisterWorkerRequest -> WorkerInfo; BadRequest on empty worker_id, bad role or bad profile."""
    require(req.worker_id, "worker_id")
    return WorkerInfo(
        req.worker_id, role_from_pb(req.role), req.grpc_address, req.data_plane_address,
        req.cache_abi_digest, capacity_from_pb(req.capacity), profile_from_pb(req.profile),
        req.colocated_only_reason,
    )


def initial_load(cap: WorkerCapacity) -> LoadReport:
    """Load of a worker that just registered: nothing queued, every block free.
    The first heartbeat replaces it."""
    return LoadReport(free_blocks=cap.total_blocks, total_blocks=cap.total_blocks)


def worker_record_to_pb(rec: WorkerRecord) -> common_pb2.WorkerInfo:
    """A live worker as ClusterSnapshot reports it."""
    return common_pb2.WorkerInfo(
        worker_id=rec.worker_id, role=ROLE_TO_PB[rec.role], grpc_address=rec.grpc_addr,
        data_plane_address=rec.data_addr, cache_abi_digest=rec.abi_digest,
        capacity=capacity_to_pb(rec.capacity), epoch=rec.epoch, load=load_to_pb(rec.load),
        lease_expires_unix_ms=rec.lease_expiry_ms, profile=profile_to_pb(rec.profile),
        colocated_only_reason=rec.colocated_only_reason,
    )


def worker_record_from_pb(pb: common_pb2.WorkerInfo) -> WorkerRecord:
    """ClusterSnapshot entry -> WorkerRecord (the client's view of a live worker)."""
    return WorkerRecord(
        pb.worker_id, ROLE_FROM_PB[pb.role], pb.grpc_address, pb.data_plane_address,
        pb.cache_abi_digest, pb.epoch, pb.lease_expires_unix_ms, load_from_pb(pb.load),
        capacity_from_pb(pb.capacity), profile_from_pb(pb.profile), pb.colocated_only_reason,
    )


def role_matches(role: WorkerRole, wanted: WorkerRole | None) -> bool:
    """Snapshot filter: None matches all; a phase also matches MIXED workers."""
    return wanted is None or role == wanted or role == WorkerRole.MIXED


def hashes_from_pb(hashes, field: str, limit: int) -> list[str]:
    """Hex chain hashes, validated; BadRequest names ``field``."""
    try:
        return normalize_hashes(list(hashes), limit)
    except ValueError as exc:
        raise BadRequest(f"{field}: {exc}") from None


# ---- manifests and transactions ------------------------------------------

def manifest_blob(m: manifest_pb2.HandoffManifest) -> str:
    """Canonical JSON of a manifest (sorted keys, proto field names, defaults omitted)."""
    d = json_format.MessageToDict(m, preserving_proto_field_name=True)
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def manifest_from_blob(blob: str) -> manifest_pb2.HandoffManifest:
    """Inverse of ``manifest_blob``; an empty blob gives an empty manifest.
    Fields this build does not know (stored by a newer directory) are skipped."""
    m = manifest_pb2.HandoffManifest()
    if blob:
        json_format.ParseDict(json.loads(blob), m, ignore_unknown_fields=True)
    return m


def kv_digest(m: manifest_pb2.HandoffManifest) -> str:
    """Digest over the manifest's chunk checksums, in chunk order: the value
    Validated/Publish must carry as ``kv_digest``. Must match what the decode
    worker computes (``kv_directory.store.digest_checksums`` over the checksums)."""
    return digest_checksums([c.checksum for c in m.expected_chunks])


def spec_from_manifest(m: manifest_pb2.HandoffManifest) -> TransferSpec:
    """HandoffManifest -> TransferSpec; BadRequest naming the first bad field."""
    for field in ("transfer_id", "request_id", "tenant", "generation",
                  "source_worker_id", "source_epoch", "destination_worker_id", "destination_epoch"):
        require(getattr(m, field), f"manifest.{field}")
    blob = manifest_blob(m)
    return TransferSpec(
        transfer_id=m.transfer_id, request_id=m.request_id, tenant=m.tenant, generation=m.generation,
        source=WorkerRef(m.source_worker_id, m.source_epoch),
        dest=WorkerRef(m.destination_worker_id, m.destination_epoch),
        manifest_digest=hashlib.sha256(blob.encode()).hexdigest(),
        route_epoch=m.route_epoch, manifest_blob=blob,
    )


_VALIDATED_OR_LATER = (TxnState.VALIDATED, TxnState.PUBLISHED, TxnState.RELEASED)


def txn_to_pb(t: Transaction) -> manifest_pb2.Transaction:
    """Stored transaction -> proto, with the manifest it was reserved with.

    ``kv_digest`` is reported once the transaction passed VALIDATED; Validated
    only applies when the caller's digest equals the manifest's (or is empty),
    so the manifest's digest is the recorded one."""
    s, m = t.spec, manifest_from_blob(t.spec.manifest_blob)
    return manifest_pb2.Transaction(
        request_id=s.request_id, transfer_id=s.transfer_id, tenant=s.tenant, generation=s.generation,
        attempt=m.attempt, state=STATE_TO_PB[t.state],
        source_worker_id=s.source.worker_id, source_epoch=s.source.epoch,
        destination_worker_id=s.dest.worker_id, destination_epoch=s.dest.epoch,
        reservation_id=m.reservation_id, chunks_expected=len(m.expected_chunks),
        kv_digest=kv_digest(m) if t.state in _VALIDATED_OR_LATER and s.manifest_blob else "",
        abort_reason=t.abort_reason, created_unix_ms=t.created_ms, updated_unix_ms=t.updated_ms,
        manifest=m,
    )


def txn_response(outcome: Outcome, txn: Transaction | None, request_id: str,
                 transfer_id: str, request_generation: int = 0) -> directory_pb2.TxnResponse:
    """TxnResponse for any transition. ``current_generation`` is the request's
    current generation where the store answers it (reserve), else the transaction's."""
    return directory_pb2.TxnResponse(
        request_id=request_id, transfer_id=transfer_id, outcome=OUTCOME_TO_PB[outcome],
        state=STATE_TO_PB[txn.state] if txn else manifest_pb2.TXN_STATE_UNSPECIFIED,
        current_generation=request_generation or (txn.generation if txn else 0),
    )


def fence(t: Transaction, request_id: str, generation: int, worker_id: str, worker_epoch: int,
          destination_only: bool = False) -> Outcome | None:
    """Check a transition request against the transaction's immutable identity.

    Returns the rejecting outcome, or None when the store may decide. Because
    every field compared here is fixed at reserve time, checking it before the
    store's atomic transition is race-free.

    * another request id (or, for publish, another destination) -> CHECKSUM_CONFLICT
    * ``worker_id`` is an end of the transaction but ``worker_epoch`` is not
      the epoch it was reserved with -> LEASE_LOST (STALE_EPOCH on the wire);
      a caller that is neither end (the router, an operator) is not fenced
    * ``generation`` is not the transaction's -> STALE_GENERATION
    """
    s = t.spec
    if request_id != s.request_id or (destination_only and worker_id != s.dest.worker_id):
        return Outcome.CHECKSUM_CONFLICT
    if any(worker_id == end.worker_id and worker_epoch != end.epoch for end in (s.source, s.dest)):
        return Outcome.LEASE_LOST
    if generation != s.generation:
        return Outcome.STALE_GENERATION
    return None


def digest_mismatch(t: Transaction, digest: str) -> bool:
    """True if ``digest`` is given and is not the manifest's kv digest.
    Transactions reserved without a manifest (store-level callers) are not checked."""
    return bool(digest and t.spec.manifest_blob and digest != kv_digest(manifest_from_blob(t.spec.manifest_blob)))
