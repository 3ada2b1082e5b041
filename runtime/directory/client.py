"""Async client of the Directory service, for workers and the router.

    async with DirectoryClient("127.0.0.1:50070", timeout_s=2.0) as d:
        reg = await d.register_worker(WorkerInfo("decode-0", WorkerRole.DECODE, grpc, data, abi, capacity))
        lease = await d.heartbeat("decode-0", reg.epoch, load)          # lease.ok False -> re-register
        r = await d.reserve(manifest)                                    # r.outcome, r.state
        r = await d.publish(rid, tid, generation, "decode-0", reg.epoch, kv_digest=digest)

Errors: every call either returns the directory's answer or raises
``DirectoryUnavailable`` (gRPC UNAVAILABLE or DEADLINE_EXCEEDED: the directory
or its Redis is down or slow) or ``ValueError`` (INVALID_ARGUMENT: the request
was malformed; the message names the field). A rejected transition is not an
exception: it is ``TxnReply.outcome``. The client does not retry; every
directory operation is idempotent, so the caller may.

Types are the store's where they exist (``WorkerInfo``, ``WorkerRecord``,
``LoadReport``, ``ClusterSnapshot``, ``Outcome``, ``TxnState``, ``WorkerRole``);
``Outcome.LEASE_LOST`` is what the wire calls STALE_EPOCH.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import grpc

from pdserve_client.rpc.pd.v1 import common_pb2, directory_pb2, directory_pb2_grpc, manifest_pb2
from runtime.common.grpc_server import MAX_MESSAGE_BYTES, RECONNECT_OPTIONS
from runtime.directory.records import (
    ClusterSnapshot,
    DirectoryUnavailable,
    LoadReport,
    ReleaseHead,
    WorkerInfo,
    WorkerRef,
    WorkerRole,
)
from runtime.directory.states import Outcome, TxnState
from runtime.directory.wire import (
    OUTCOME_FROM_PB,
    ROLE_TO_PB,
    STATE_FROM_PB,
    capacity_to_pb,
    load_to_pb,
    profile_to_pb,
    worker_record_from_pb,
)
from runtime.release.record import ReleaseRecord
from runtime.release.wire import record_from_pb, record_to_pb
from runtime.security.tls import Security

_UNAVAILABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclasses.dataclass(frozen=True, slots=True)
class Registration:
    """Result of ``register_worker``: the new epoch and how often to heartbeat."""

    epoch: int
    lease_ttl_ms: int
    route_epoch: int
    routes_stopped: bool = False
    """A rollback stopped new disaggregated routes: take no transfer work."""


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """Result of ``heartbeat``. ``ok`` False: the lease is lost; abandon
    unpublished work and re-register."""

    ok: bool
    lease_ttl_ms: int
    route_epoch: int
    routes_stopped: bool = False
    """A rollback stopped new disaggregated routes: take no transfer work."""


@dataclasses.dataclass(frozen=True, slots=True)
class TxnReply:
    """Result of a transaction transition (reserve, begin, ..., release)."""

    request_id: str
    transfer_id: str
    outcome: Outcome
    state: TxnState | None
    """State after the call; None when NOT_FOUND (or rejected before creation)."""
    current_generation: int
    """Reserve: the request's current generation after the call (a reserve at or
    below it was refused as stale). Other transitions: the transaction's
    generation. 0 when there is none."""

    @property
    def ok(self) -> bool:
        """APPLIED or DUPLICATE: the requested state holds."""
        return self.outcome.ok

    @classmethod
    def from_pb(cls, r: directory_pb2.TxnResponse) -> TxnReply:
        """Proto TxnResponse -> TxnReply."""
        state = None if r.state == manifest_pb2.TXN_STATE_UNSPECIFIED else STATE_FROM_PB[r.state]
        return cls(r.request_id, r.transfer_id, OUTCOME_FROM_PB[r.outcome], state, r.current_generation)


@dataclasses.dataclass(frozen=True, slots=True)
class TxnRecord:
    """A stored transaction, as ``lookup`` and ``list_open`` return it."""

    request_id: str
    transfer_id: str
    tenant: str
    generation: int
    attempt: int
    state: TxnState
    source: WorkerRef
    dest: WorkerRef
    reservation_id: str
    chunks_expected: int
    kv_digest: str
    """The K/V digest the source declared; both ends' once VALIDATED."""
    abort_reason: str
    created_unix_ms: int
    updated_unix_ms: int
    manifest: manifest_pb2.HandoffManifest
    """The manifest it was reserved with: the copy the destination validates against."""

    @classmethod
    def from_pb(cls, t: manifest_pb2.Transaction) -> TxnRecord:
        """Proto Transaction -> TxnRecord."""
        return cls(
            t.request_id, t.transfer_id, t.tenant, t.generation, t.attempt, STATE_FROM_PB[t.state],
            WorkerRef(t.source_worker_id, t.source_epoch), WorkerRef(t.destination_worker_id, t.destination_epoch),
            t.reservation_id, t.chunks_expected, t.kv_digest, t.abort_reason,
            t.created_unix_ms, t.updated_unix_ms, t.manifest,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ReleaseWrite:
    """Answer to a release write: APPLIED, STALE_GENERATION (read again) or
    ILLEGAL_TRANSITION (`message` says why), and the stored record after it."""

    outcome: Outcome
    current: ReleaseRecord | None
    message: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class RouteEpoch:
    """Result of ``advance_route_epoch``."""

    route_epoch: int
    advanced: bool
    publications: int = 0
    """Of an advance: the publications under the epoch it retired, at that instant."""


class StaleRouteEpoch(Exception):
    """A capability's route epoch is no longer the directory's (it was revoked)."""


class TransferNotRecorded(Exception):
    """ConsumeNonce named a transfer the directory holds no record of (the router records
    one before its capability leaves: given up, or never made)."""


class NonceRefused(Exception):
    """The directory refused a ConsumeNonce caller (PERMISSION_DENIED): the capability it
    sent did not pass the directory's checks, or the caller is not the destination."""


class DirectoryClient:
    """Typed async calls to pd.v1.Directory over one grpc.aio channel.

    Create and use it inside one event loop; ``close()`` (or ``async with``)
    when done. ``timeout_s`` is the deadline of every call.
    """

    def __init__(self, address: str, timeout_s: float = 5.0, security: Security | None = None):
        """security: this process's TLS identity (default: from PD_TLS_* / PD_INSECURE)."""
        self.address = address
        self.timeout_s = timeout_s
        security = security or Security.from_env("directory client")
        self._channel = security.aio_channel(address, "directory", options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            *RECONNECT_OPTIONS,  # a restarted directory is reached again within a second
        ])
        self._stub = directory_pb2_grpc.DirectoryStub(self._channel)

    async def close(self) -> None:
        """Close the channel; in-flight calls are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> DirectoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, rpc: str, request: Any, timeout_s: float | None = None) -> Any:
        try:
            return await getattr(self._stub, rpc)(request, timeout=timeout_s or self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _UNAVAILABLE_CODES:
                raise DirectoryUnavailable(
                    f"directory {self.address} {rpc}: {exc.code().name}: {exc.details()}") from exc
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise ValueError(f"directory {rpc}: {exc.details()}") from exc
            raise

    # ---- registry ----------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> Registration:
        """Register (or re-register) ``info`` (capacity included); a fresh epoch
        fences everything the worker's previous epoch left unpublished."""
        r = await self._call("RegisterWorker", directory_pb2.RegisterWorkerRequest(
            worker_id=info.worker_id, role=ROLE_TO_PB[info.role], grpc_address=info.grpc_address,
            data_plane_address=info.data_plane_address, cache_abi_digest=info.cache_abi_digest,
            capacity=capacity_to_pb(info.capacity), profile=profile_to_pb(info.profile),
            colocated_only_reason=info.colocated_only_reason, model_identity=info.model_identity,
            seal_key=info.seal_key))
        return Registration(r.epoch, r.lease_ttl_ms, r.route_epoch, r.routes_stopped)

    async def heartbeat(self, worker_id: str, epoch: int, load: LoadReport | None = None) -> Lease:
        """Renew the lease and replace the load report."""
        r = await self._call("Heartbeat", directory_pb2.HeartbeatRequest(
            worker_id=worker_id, epoch=epoch, load=load_to_pb(load or LoadReport())))
        return Lease(r.status == directory_pb2.LEASE_STATUS_OK, r.lease_ttl_ms, r.route_epoch, r.routes_stopped)

    async def deregister_worker(self, worker_id: str, epoch: int, timeout_s: float | None = None) -> bool:
        """Leave the cluster now (a draining worker): True if it was live at ``epoch``
        and is gone; False if its lease had already lapsed (or a newer epoch exists)."""
        r = await self._call("DeregisterWorker", directory_pb2.DeregisterWorkerRequest(
            worker_id=worker_id, epoch=epoch), timeout_s)
        return r.deregistered

    async def snapshot(self, role: WorkerRole | None = None) -> ClusterSnapshot:
        """Live workers sorted by id (``role``: that role or MIXED; None: all),
        the route epoch, and the directory's clock as ``now_ms``."""
        r = await self._call("ClusterSnapshot", directory_pb2.ClusterSnapshotRequest(
            role=common_pb2.WORKER_ROLE_UNSPECIFIED if role is None else ROLE_TO_PB[WorkerRole(role)]))
        workers = sorted((worker_record_from_pb(w) for w in r.workers), key=lambda w: w.worker_id)
        return ClusterSnapshot(tuple(workers), r.route_epoch, r.snapshot_unix_ms,
                               ReleaseHead(r.release_version, r.release_mode, r.routes_stopped))

    # ---- transactions ------------------------------------------------------

    async def reserve(self, manifest: manifest_pb2.HandoffManifest) -> TxnReply:
        """Create the transaction in RESERVED. Same transfer id and identical
        manifest: DUPLICATE; any field different: CHECKSUM_CONFLICT."""
        return TxnReply.from_pb(await self._call("Reserve", directory_pb2.TxnReserveRequest(manifest=manifest)))

    async def _move(self, rpc: str, request_id: str, transfer_id: str, generation: int, worker_id: str,
                    epoch: int, **extra: Any) -> TxnReply:
        return TxnReply.from_pb(await self._call(rpc, directory_pb2.TxnTransitionRequest(
            request_id=request_id, transfer_id=transfer_id, generation=generation,
            worker_id=worker_id, worker_epoch=epoch, **extra)))

    async def begin(self, request_id: str, transfer_id: str, generation: int, worker_id: str,
                    epoch: int, kv_digest: str = "",
                    chunks: Sequence[manifest_pb2.ChunkSpec] = ()) -> TxnReply:
        """RESERVED -> TRANSFERRING; with ``kv_digest`` (the source's digest of the
        prompt's K/V, once computed) and ``chunks`` (its chunk list with checksums, in
        manifest order) also declares them, here or in a second begin."""
        return await self._move("Begin", request_id, transfer_id, generation, worker_id, epoch,
                                kv_digest=kv_digest, chunks=chunks)

    async def validated(self, request_id: str, transfer_id: str, generation: int, worker_id: str,
                        epoch: int, kv_digest: str,
                        chunks: Sequence[manifest_pb2.ChunkSpec]) -> TxnReply:
        """TRANSFERRING -> VALIDATED iff ``kv_digest`` (the destination's digest of
        what it holds) is the one the source declared and ``chunks`` (what arrived,
        in manifest order) has the manifest's layout; else CHECKSUM_CONFLICT."""
        return await self._move("Validated", request_id, transfer_id, generation, worker_id, epoch,
                                kv_digest=kv_digest, chunks=list(chunks))

    async def publish(self, request_id: str, transfer_id: str, generation: int, worker_id: str,
                      epoch: int, kv_digest: str, chunks: Sequence[manifest_pb2.ChunkSpec] = (),
                      source_seal: bytes = b"") -> TxnReply:
        """VALIDATED -> PUBLISHED iff ``generation`` is still current and ``kv_digest``
        is the validated one; the caller must be the destination at the manifest's epoch.
        With ``chunks`` (what arrived, as for ``validated``): validated then published in
        one directory operation, the first refusal the answer. With ``source_seal`` (the
        source's, from its COMMIT): declared by it first, in that same operation."""
        return TxnReply.from_pb(await self._call("Publish", directory_pb2.TxnPublishRequest(
            request_id=request_id, transfer_id=transfer_id, generation=generation,
            destination_worker_id=worker_id, destination_epoch=epoch, kv_digest=kv_digest, chunks=list(chunks),
            source_seal=source_seal)))

    async def abort(self, request_id: str, transfer_id: str, generation: int, worker_id: str,
                    epoch: int = 0, reason: str = "") -> TxnReply:
        """Any unpublished state -> ABORTED (DUPLICATE if already). A caller that
        is not an end of the transaction (the router) may pass epoch 0."""
        return await self._move("Abort", request_id, transfer_id, generation, worker_id, epoch, reason=reason)

    async def release(self, request_id: str, transfer_id: str, generation: int, worker_id: str,
                      epoch: int) -> TxnReply:
        """PUBLISHED -> RELEASED (the source may free its copy)."""
        return await self._move("Release", request_id, transfer_id, generation, worker_id, epoch)

    async def lookup(self, request_id: str, transfer_id: str) -> TxnRecord | None:
        """The transaction with its manifest, or None (unknown, other request, or retention over)."""
        r = await self._call("Lookup", directory_pb2.TxnLookupRequest(request_id=request_id, transfer_id=transfer_id))
        return TxnRecord.from_pb(r.transaction) if r.found else None

    async def list_open(self, worker_id: str = "") -> list[TxnRecord]:
        """Unpublished transactions (of ``worker_id`` at either end, or all), by transfer id."""
        r = await self._call("ListOpenTransactions", directory_pb2.ListOpenTransactionsRequest(worker_id=worker_id))
        return sorted((TxnRecord.from_pb(t) for t in r.transactions), key=lambda t: t.transfer_id)

    # ---- route epoch and nonces --------------------------------------------

    async def get_route_epoch(self) -> int:
        """Current route epoch (0 before the first advance)."""
        return (await self._call("GetRouteEpoch", directory_pb2.GetRouteEpochRequest())).route_epoch

    async def advance_route_epoch(self, expected: int = 0, reason: str = "") -> RouteEpoch:
        """Advance the route epoch; with ``expected`` != 0 only if it still equals it."""
        r = await self._call("AdvanceRouteEpoch", directory_pb2.AdvanceRouteEpochRequest(
            expected_route_epoch=expected, reason=reason))
        return RouteEpoch(r.route_epoch, r.advanced, r.publications)

    async def publications(self, route_epoch: int) -> int:
        """Transactions published under `route_epoch` so far."""
        r = await self._call("GetRouteEpoch", directory_pb2.GetRouteEpochRequest(publications_of=route_epoch))
        return r.publications

    async def consume_nonce(self, nonce: str, expires_unix_ms: int, transfer_id: str = "",
                            route_epoch: int = 0, capability: bytes = b"") -> bool:
        """True the first time ``nonce`` is consumed, False on any replay. With
        ``route_epoch``, also False (StaleRouteEpoch raised) when it is not current;
        TransferNotRecorded while the directory holds no record of ``transfer_id`` (never
        with ``capability``, the signed one, at a directory that holds the keys);
        NonceRefused when the directory refuses this caller or that capability."""
        try:
            r = await self._call("ConsumeNonce", directory_pb2.ConsumeNonceRequest(
                nonce=nonce, expires_unix_ms=expires_unix_ms, transfer_id=transfer_id, route_epoch=route_epoch,
                capability=capability))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                raise NonceRefused(exc.details()) from exc
            raise
        if r.stale_route_epoch:
            raise StaleRouteEpoch(f"route epoch {route_epoch} is no longer current")
        if r.not_recorded:
            raise TransferNotRecorded(f"the directory holds no transfer {transfer_id!r}")
        return r.consumed

    # ---- release (docs/design.md, The release; kv_directory/release.py) -------

    async def get_release(self) -> ReleaseRecord | None:
        """The release record (None while none was written)."""
        r = await self._call("GetRelease", directory_pb2.GetReleaseRequest())
        return record_from_pb(r.record) if r.found else None

    async def write_release(self, expected_version: int, record: ReleaseRecord) -> ReleaseWrite:
        """Compare-and-set the record (see Directory.WriteRelease)."""
        r = await self._call("WriteRelease", directory_pb2.WriteReleaseRequest(
            expected_version=expected_version, record=record_to_pb(record)))
        current = record_from_pb(r.current) if r.HasField("current") else None
        return ReleaseWrite(OUTCOME_FROM_PB[r.outcome], current, r.message)
