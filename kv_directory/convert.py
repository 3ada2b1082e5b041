"""The directory service's side of the wire: manifests stored with their
transactions, transaction replies, fences and the checks a request gets before
the store. Pure functions, no gRPC and no Redis. The record mappings both ends
share are runtime/directory/wire.py.

The manifest is stored with its transaction as canonical JSON
(``manifest_blob``); the transaction's identity digest is the sha256 of that
text, so a retry by transfer id is DUPLICATE only if *every* manifest field is
equal, and CHECKSUM_CONFLICT otherwise (docs/design.md, Contracts).
"""

from __future__ import annotations

import hashlib
import json

from google.protobuf import json_format

from pdserve_client.rpc.pd.v1 import directory_pb2, manifest_pb2
from runtime.directory.chunk_plan import tiling_error
from runtime.directory.records import (
    LoadReport,
    Transaction,
    TransferSpec,
    WorkerCapacity,
    WorkerInfo,
    WorkerRef,
    WorkerRole,
    chunk_list_digest,
    kv_part,
)
from runtime.directory.states import Outcome
from runtime.directory.wire import (
    OUTCOME_TO_PB,
    STATE_TO_PB,
    BadRequest,
    capacity_from_pb,
    chunk_layouts,
    profile_from_pb,
    require,
    role_from_pb,
)


def worker_info_from_pb(req: directory_pb2.RegisterWorkerRequest) -> WorkerInfo:
    """RegisterWorkerRequest -> WorkerInfo; BadRequest on empty worker_id, bad role or bad profile."""
    require(req.worker_id, "worker_id")
    try:
        return WorkerInfo(
            req.worker_id, role_from_pb(req.role), req.grpc_address, req.data_plane_address,
            req.cache_abi_digest, capacity_from_pb(req.capacity), profile_from_pb(req.profile),
            req.colocated_only_reason, req.model_identity, req.seal_key,
        )
    except ValueError as e:
        raise BadRequest(str(e)) from e


def initial_load(cap: WorkerCapacity) -> LoadReport:
    """Load of a worker that just registered: nothing queued, every block free.
    The first heartbeat replaces it."""
    return LoadReport(free_blocks=cap.total_blocks, total_blocks=cap.total_blocks)


def role_matches(role: WorkerRole, wanted: WorkerRole | None) -> bool:
    """Snapshot filter: None matches all; a phase also matches MIXED workers."""
    return wanted is None or role == wanted or role == WorkerRole.MIXED


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


def expected_chunks_digest(m: manifest_pb2.HandoffManifest) -> str:
    """``chunk_list_digest`` of the manifest's expected chunks, after checking they
    tile its token interval (BadRequest naming what is wrong)."""
    layouts = chunk_layouts(m.expected_chunks)
    start, end = m.token_interval.start, m.token_interval.end
    if layouts or end > start:
        if not m.block_size:
            raise BadRequest("manifest.block_size must be set when the manifest moves tokens")
        if start % m.block_size:
            raise BadRequest(f"manifest.token_interval.start {start} is not a multiple of "
                             f"block_size {m.block_size}")
        why = tiling_error(layouts, start // m.block_size, -(-end // m.block_size))
        if why:
            raise BadRequest(f"manifest.expected_chunks do not tile token_interval [{start}, {end}): {why}")
    return chunk_list_digest(layouts)


def spec_from_manifest(m: manifest_pb2.HandoffManifest) -> TransferSpec:
    """HandoffManifest -> TransferSpec; BadRequest naming the first bad field."""
    for field in ("transfer_id", "request_id", "tenant", "generation",
                  "source_worker_id", "source_epoch", "destination_worker_id", "destination_epoch"):
        require(getattr(m, field), f"manifest.{field}")
    chunks_digest = expected_chunks_digest(m)
    blob = manifest_blob(m)
    return TransferSpec(
        transfer_id=m.transfer_id, request_id=m.request_id, tenant=m.tenant, generation=m.generation,
        source=WorkerRef(m.source_worker_id, m.source_epoch),
        dest=WorkerRef(m.destination_worker_id, m.destination_epoch),
        manifest_digest=hashlib.sha256(blob.encode()).hexdigest(), chunks_digest=chunks_digest,
        route_epoch=m.route_epoch, manifest_blob=blob,
    )


def txn_to_pb(t: Transaction) -> manifest_pb2.Transaction:
    """Stored transaction -> proto, with the manifest it was reserved with and the
    K/V digest the source declared (both ends' once VALIDATED)."""
    s, m = t.spec, manifest_from_blob(t.spec.manifest_blob)
    return manifest_pb2.Transaction(
        request_id=s.request_id, transfer_id=s.transfer_id, tenant=s.tenant, generation=s.generation,
        attempt=m.attempt, state=STATE_TO_PB[t.state],
        source_worker_id=s.source.worker_id, source_epoch=s.source.epoch,
        destination_worker_id=s.dest.worker_id, destination_epoch=s.dest.epoch,
        reservation_id=m.reservation_id, chunks_expected=len(m.expected_chunks),
        kv_digest=kv_part(t.kv_digest),
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


def fence(s: TransferSpec, request_id: str, generation: int, worker_id: str, worker_epoch: int,
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
    if request_id != s.request_id or (destination_only and worker_id != s.dest.worker_id):
        return Outcome.CHECKSUM_CONFLICT
    if any(worker_id == end.worker_id and worker_epoch != end.epoch for end in (s.source, s.dest)):
        return Outcome.LEASE_LOST
    if generation != s.generation:
        return Outcome.STALE_GENERATION
    return None
