"""The directory's records: what workers, the router, the SDK and the directory
service say to each other about workers and transfer transactions, in one place
(the store interface is kv_directory/store.py; the wire mapping is
runtime/directory/wire.py).

Time: every ``*_ms`` field is on the directory store's clock (Redis ``TIME``).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import struct
from collections.abc import Iterable

from runtime.directory.cost_profile import CostProfile
from runtime.directory.states import Outcome, TxnState


class DirectoryUnavailable(RuntimeError):
    """The backing store could not be reached or refused service; retry later.

    The gRPC layer maps this to UNAVAILABLE. Raised instead of any answer the
    store could not vouch for.
    """


class WorkerRole(str, enum.Enum):
    """What a worker serves. MIXED runs both phases (colocated fallback)."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"


@dataclasses.dataclass(frozen=True, slots=True)
class LoadReport:
    """A worker's self-reported load, replaced wholesale on every heartbeat."""

    pending_prefill_tokens: int = 0
    active_decode_batch: int = 0
    free_blocks: int = 0
    reserved_blocks: int = 0
    total_blocks: int = 0
    active_context_tokens: int = 0
    """Tokens the decode batch attends over (sum of its sequences' lengths)."""
    active_blocks: int = 0
    """Blocks held by running work (prefills in flight, sequences decoding);
    free + reserved + active == total."""
    cached_blocks: int = 0
    """Of the free blocks, those holding a reusable prefix."""
    connector_disabled: int = 0
    """1 while the worker refuses transfer work because a rollback stopped new routes
    (the rollback's DISABLE_CONNECTOR step waits until every live worker reports it)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"LoadReport.{f.name} must be >= 0")

    def as_args(self) -> list[int]:
        """Field values in declaration order (the wire order of the Lua scripts)."""
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


LOAD_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(LoadReport))


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerCapacity:
    """Static capacity a worker declares at registration (stable for one epoch).

    Must match pd.v1.WorkerCapacity field for field (kv_directory/convert.py maps
    by name; tests/unit/directory/test_convert.py checks)."""

    total_blocks: int = 0
    max_decode_batch: int = 0
    max_prefill_tokens: int = 0
    block_size: int = 0
    vocab_size: int = 0
    max_model_len: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"WorkerCapacity.{f.name} must be >= 0")

    def as_args(self) -> list[int]:
        """Field values in declaration order (the wire order of the Lua scripts)."""
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


CAPACITY_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(WorkerCapacity))


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker declares when it registers (stable for one epoch)."""

    worker_id: str
    role: WorkerRole
    grpc_address: str
    data_plane_address: str
    cache_abi_digest: str
    """Digest of the worker's cache ABI; routes pair only equal digests."""
    capacity: WorkerCapacity = WorkerCapacity()
    profile: CostProfile = CostProfile()
    """Cost model measured at start (empty when the worker declares none)."""
    colocated_only_reason: str = ""
    """Why the worker serves colocated requests only and never exchanges K/V (its
    start-up kernel self-check failed); empty: hand-offs allowed."""
    model_identity: str = ""
    """Digest of the model's config and weights (runtime/engine/abi.py), for the release's
    deployment manifest; empty: not declared."""
    seal_key: bytes = b""
    """The raw Ed25519 public key this process seals its K/V declarations with
    (runtime/security/seal.py); empty: it seals none."""

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise ValueError("worker_id must be non-empty")
        if self.seal_key and len(self.seal_key) != 32:
            raise ValueError(f"seal_key is 32 raw bytes (an Ed25519 public key), got {len(self.seal_key)}")
        object.__setattr__(self, "role", WorkerRole(self.role))


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A registered, live worker as the directory sees it: the one worker record
    (the directory stores it, the router places requests on it, pdctl shows it)."""

    worker_id: str
    role: WorkerRole
    grpc_address: str
    data_plane_address: str = ""
    cache_abi_digest: str = ""
    """Digest of the worker's cache ABI; routes pair only equal digests."""
    capacity: WorkerCapacity = WorkerCapacity()
    load: LoadReport = LoadReport()
    """From the latest heartbeat (before the first: every block free)."""
    epoch: int = 1
    """Bumped on every registration; fences everything the previous process did."""
    lease_expiry_ms: int = 0
    """Store clock; the worker is dead at or after this instant."""
    profile: CostProfile = CostProfile()
    """Cost model the worker measured at start (empty: none declared)."""
    colocated_only_reason: str = ""
    """As declared at registration (WorkerInfo.colocated_only_reason)."""
    model_identity: str = ""
    """As declared at registration (WorkerInfo.model_identity)."""
    seal_key: bytes = b""
    """As registered (WorkerInfo.seal_key): the router opens this worker's seals, relayed
    with a hand-off's token 0, with it; empty: it seals none."""
    load_reported_ms: int = 0
    """Store clock when `load` was stored (its heartbeat or registration); with a
    snapshot's `now_ms` it gives the report's age (0: not known)."""

    can_prefill: bool = dataclasses.field(init=False, repr=False, compare=False)
    """PREFILL and MIXED workers (from `role`; a field, not a property: the router's
    decision reads it per candidate)."""
    can_decode: bool = dataclasses.field(init=False, repr=False, compare=False)
    """DECODE and MIXED workers (they also serve colocated requests)."""

    def __post_init__(self) -> None:
        role = WorkerRole(self.role)
        object.__setattr__(self, "role", role)
        object.__setattr__(self, "can_prefill", role is not WorkerRole.DECODE)
        object.__setattr__(self, "can_decode", role is not WorkerRole.PREFILL)

    @property
    def ref(self) -> WorkerRef:
        """This worker at this epoch."""
        return WorkerRef(self.worker_id, self.epoch)


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerRef:
    """One worker incarnation: a transaction is bound to both ends' epochs."""

    worker_id: str
    epoch: int

    def __post_init__(self) -> None:
        if not self.worker_id or self.epoch < 1:
            raise ValueError(f"bad worker ref {self.worker_id!r}@{self.epoch}")


@dataclasses.dataclass(frozen=True, slots=True)
class ReleaseHead:
    """What a cluster snapshot says of the release record: enough for a router to see
    it changed (then it reads the record) and whether routes are stopped."""

    version: int = 0
    """0: no record written yet."""
    state: int = 0
    """runtime/release/machine.py Release value (0: none)."""
    routes_stopped: bool = False
    """A rollback stopped new disaggregated routes; the directory refuses their reserve."""


@dataclasses.dataclass(frozen=True, slots=True)
class StoredRelease:
    """The release record as the directory stores it: its head and its encoded proto."""

    head: ReleaseHead
    record: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Live workers (sorted by id) and the route epoch, read atomically: the one
    cluster view (the router places requests on it)."""

    workers: tuple[WorkerRecord, ...]
    route_epoch: int = 0
    now_ms: int = 0
    """Store clock when the snapshot was read."""
    release: ReleaseHead = dataclasses.field(default_factory=ReleaseHead)
    """The release record's head at that moment (runtime/release)."""

    def worker(self, worker_id: str) -> WorkerRecord | None:
        """The live record of ``worker_id``, or None."""
        return next((w for w in self.workers if w.worker_id == worker_id), None)


def chunk_list_digest(chunks: Iterable[tuple[int, int, int, int]]) -> str:
    """Order-sensitive sha256 hex of a transfer set's chunk layout: one
    (layer, block_start, block_count, num_bytes) per chunk, in manifest order.
    The directory fixes it at reserve and compares the destination's at VALIDATED."""
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(struct.pack("<4Q", *chunk))
    return h.hexdigest()


def chunk_sums_digest(chunks: Iterable[tuple[int, int, int, int, str]]) -> str:
    """Order-sensitive sha256 hex of a chunk list with each chunk's checksum: one
    (layer, block_start, block_count, num_bytes, checksum hex) per chunk."""
    h = hashlib.sha256()
    for *layout, checksum in chunks:
        h.update(struct.pack("<4Q", *layout) + checksum.encode() + b"\0")
    return h.hexdigest()


EVIDENCE_SEPARATOR = "+"


def evidence(kv_digest: str, sums_digest: str) -> str:
    """What the directory keeps of a source's declaration and compares the destination's
    against: its K/V digest and its chunk list with checksums, as one string."""
    return f"{kv_digest}{EVIDENCE_SEPARATOR}{sums_digest}"


def kv_part(stored: str) -> str:
    """The K/V digest in a stored declaration (what records and statuses show)."""
    return stored.partition(EVIDENCE_SEPARATOR)[0]


NO_CHUNKS_DIGEST = chunk_list_digest(())
"""The layout digest of an empty transfer set (the destination held every block)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TransferSpec:
    """The immutable identity of one transfer, fixed at reserve time.

    A retry with the same transfer id is idempotent only if every field here is
    equal; otherwise it is CHECKSUM_CONFLICT (corruption: docs/design.md, Contracts).
    """

    transfer_id: str
    request_id: str
    tenant: str
    generation: int
    """Attempt number of the request; a newer one supersedes older ones."""
    source: WorkerRef
    dest: WorkerRef
    manifest_digest: str
    chunks_digest: str = NO_CHUNKS_DIGEST
    """``chunk_list_digest`` of the expected chunks: VALIDATED needs the same list."""
    route_epoch: int = 0
    """Route epoch the route was chosen under; 0 = not checked."""
    manifest_blob: str = dataclasses.field(default="", compare=False)
    """Opaque text stored with the transaction and returned by ``lookup`` (the
    gRPC layer keeps the full manifest here). Not part of the identity: put a
    digest of whatever identifies the transfer in ``manifest_digest``."""

    def __post_init__(self) -> None:
        for name in ("transfer_id", "request_id", "tenant", "manifest_digest", "chunks_digest"):
            if not getattr(self, name):
                raise ValueError(f"TransferSpec.{name} must be non-empty")
        if self.generation < 1 or self.route_epoch < 0:
            raise ValueError("generation must be >= 1 and route_epoch >= 0")


@dataclasses.dataclass(frozen=True, slots=True)
class Transaction:
    """A transfer transaction as stored: its identity plus where it stands."""

    spec: TransferSpec
    state: TxnState
    abort_reason: str
    created_ms: int
    updated_ms: int
    deadline_ms: int
    """Store clock; an unpublished transaction is aborted at this instant."""
    kv_digest: str = ""
    """The K/V digest the source declared (``begin``); VALIDATED needs the
    destination's to be equal. Empty until declared."""

    @property
    def transfer_id(self) -> str:
        """Shorthand for ``spec.transfer_id``."""
        return self.spec.transfer_id

    @property
    def generation(self) -> int:
        """Shorthand for ``spec.generation``."""
        return self.spec.generation


@dataclasses.dataclass(frozen=True, slots=True)
class TxnResult:
    """Outcome of a transaction operation and the record as it now stands
    (None only for NOT_FOUND)."""

    outcome: Outcome
    txn: Transaction | None
    request_generation: int = 0
    """reserve only: the request's current generation after the call (0: none yet).
    A caller whose generation is not above it learns how far behind it is, e.g. a
    client re-using a finished request id within the retention window."""

    @property
    def ok(self) -> bool:
        """The requested state holds (APPLIED or DUPLICATE)."""
        return self.outcome.ok


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseResult:
    """Outcome of a heartbeat: APPLIED with the new expiry, or LEASE_LOST (expiry 0)."""

    outcome: Outcome
    lease_expiry_ms: int
    routes_stopped: bool = False
    """The release record says a rollback stopped new disaggregated routes."""


@dataclasses.dataclass(frozen=True, slots=True)
class EpochResult:
    """Outcome of a route-epoch change and the epoch now current."""

    outcome: Outcome
    route_epoch: int
    retired_publications: int = 0
    """An advance: publications made under the epoch it retired, counted in the same
    atomic step (a rollback compares it with a later count: nothing may publish after)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TransferRef:
    """One generation of a request, and the transfer (and decode reservation) it owns:
    the one place the transfer id rule lives (the router, the decode worker and the
    directory all name a hand-off by it)."""

    request_id: str
    generation: int

    @property
    def transfer_id(self) -> str:
        return f"{self.request_id}/{self.generation}"

    @classmethod
    def parse(cls, transfer_id: str) -> TransferRef:
        """The ref a transfer id names; ValueError if it names none."""
        request_id, sep, generation = transfer_id.rpartition("/")
        if not sep or not request_id or not generation.isdigit():
            raise ValueError(f"{transfer_id!r} is not a transfer id (request_id/generation)")
        return cls(request_id, int(generation))
