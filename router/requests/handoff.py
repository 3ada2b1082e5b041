"""The router's part of the K/V hand-off contract: identities and the manifest.

Per request, generation g = attempt number (1, 2, ...) and
transfer_id = f"{request_id}/{g}". The manifest the router records with
Directory.Reserve names both ends at their epochs, the reservation, the route
epoch and the token interval the destination lacks; prefill adds the expected
chunks in its commit.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from pdserve_client.rpc.pd.v1 import manifest_pb2
from router.types import Reservation, ReserveCall
from runtime.directory.records import TransferRef, WorkerRecord
from runtime.security.capability import PUSH, Grant
from runtime.transfer.base import CHECKSUM_ALGORITHM


def transfer_id(request_id: str, generation: int) -> str:
    """Transfer (and reservation) id of one generation of a request."""
    return TransferRef(request_id, generation).transfer_id


def prompt_digest(prompt: Sequence[int], tenant: str) -> str:
    """sha256 hex of the tenant (utf-8, NUL-terminated) then the prompt ids as
    little-endian uint32: the same prompt of two tenants gives two unrelated digests
    (directory records never correlate tenants' prompts)."""
    return hashlib.sha256(tenant.encode() + b"\0" + struct.pack(f"<{len(prompt)}I", *prompt)).hexdigest()


def grant(manifest: manifest_pb2.HandoffManifest, reservation: Reservation, ttl_ms: int) -> Grant:
    """The capability grant of one attempt (docs/design.md, Security): exactly the destination blocks
    the manifest's chunks land in (the reservation's physical block ids) and their bytes."""
    ids = reservation.block_ids
    regions = sorted({ids[b] for c in manifest.expected_chunks
                      for b in range(c.block_start, c.block_start + c.block_count) if b < len(ids)})
    return Grant(tenant=manifest.tenant, source_worker_id=manifest.source_worker_id,
                 source_epoch=manifest.source_epoch, destination_worker_id=manifest.destination_worker_id,
                 destination_epoch=manifest.destination_epoch, transfer_id=manifest.transfer_id,
                 generation=manifest.generation, route_epoch=manifest.route_epoch,
                 cache_abi_digest=manifest.cache_abi_digest, direction=PUSH, regions=tuple(regions),
                 max_bytes=sum(c.num_bytes for c in manifest.expected_chunks), ttl_ms=ttl_ms)


def reserve_call(req, generation: int, prefill: WorkerRecord, key: bytes) -> ReserveCall:
    """Decode.Reserve's arguments for one attempt of `req` (an Admitted request): the blocks
    for its prompt and budget, and the attempt's transfer key (runtime/transfer/keys.py)."""
    return ReserveCall(req.request_id, req.tenant, generation, req.prompt, req.max_tokens, req.sampling,
                       prefill.cache_abi_digest, key)


def job_manifest(*, request_id: str, tenant: str, generation: int, prompt: Sequence[int],
                 prefill: WorkerRecord) -> manifest_pb2.HandoffManifest:
    """The manifest of a Prefill job sent before its grant: what to compute, not where to
    (the grant's `build_manifest` names the same transfer and adds the destination)."""
    return manifest_pb2.HandoffManifest(
        request_id=request_id, tenant=tenant, generation=generation, attempt=generation,
        prompt_digest=prompt_digest(prompt, tenant), cache_abi_digest=prefill.cache_abi_digest,
        source_worker_id=prefill.worker_id, source_epoch=prefill.epoch,
        transfer_id=transfer_id(request_id, generation), checksum_algorithm=CHECKSUM_ALGORITHM)


def build_manifest(*, request_id: str, tenant: str, generation: int, prompt: Sequence[int],
                   prefill: WorkerRecord, decode: WorkerRecord, reservation: Reservation,
                   route_epoch: int, job: manifest_pb2.HandoffManifest | None = None) -> manifest_pb2.HandoffManifest:
    """The HandoffManifest for one disaggregated attempt: its job's (`job`, the one sent
    ahead to the prefill; made here when not given) with the destination, the reservation
    and the plan added.

    token_interval starts after the blocks the destination already holds
    (visible_prefix_blocks, block aligned) and ends at the prompt's end.
    """
    block_size = prefill.capacity.block_size or decode.capacity.block_size
    start = min(reservation.visible_prefix_blocks * block_size, len(prompt))
    manifest = manifest_pb2.HandoffManifest()
    manifest.CopyFrom(job if job is not None else job_manifest(
        request_id=request_id, tenant=tenant, generation=generation, prompt=prompt, prefill=prefill))
    manifest.MergeFrom(manifest_pb2.HandoffManifest(
        token_interval=manifest_pb2.TokenInterval(start=start, end=len(prompt)),
        block_size=block_size,
        expected_chunks=reservation.expected_chunks,
        destination_worker_id=reservation.destination_worker_id or decode.worker_id,
        destination_epoch=reservation.destination_epoch or decode.epoch,
        reservation_id=reservation.reservation_id,
        route_epoch=route_epoch,
        destination_block_ids=reservation.block_ids,
    ))
    return manifest
