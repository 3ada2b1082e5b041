"""The directory's domain records and its storage interface, split by role.

Who calls what (the gRPC servicer maps one RPC to one method):

* ``WorkerRegistry``   — workers: register at start, heartbeat, deregister;
  the router reads ``snapshot()``.
* ``TransferLedger``   — the router reserves a transaction, the prefill worker
  begins it, the decode worker marks it validated, publishes it and releases
  it when the sequence ends; anyone on a failure path calls ``abort`` (the
  owners are written once, in docs/design.md "The transaction").
* ``PrefixIndex``      — workers publish the hash chains they hold; the
  router looks up where a prompt's leading blocks already live.
* ``RouteEpochs``      — the router's rollback path advances the route epoch.
* ``NonceLedger``      — capability checks consume a nonce exactly once.

Failure semantics, common to every method: an answer is either the truth about
the store or ``DirectoryUnavailable``. A store that cannot reach its backend
raises; it never guesses. Rejections are ``Outcome`` values, not exceptions.

Time: every lease and deadline is judged by the *store's* clock (Redis
``TIME`` for the Redis store), never by the caller's, so two routers with
skewed clocks see the same set of live workers. ``*_ms`` fields are on that
clock; ``ClusterSnapshot.now_ms`` says what "now" was.

Liveness is lazy and eager at once: every call first reaps expired leases and
overdue transactions (so nothing expired is ever *returned*), and
``reap_expired()`` lets a janitor do it without traffic.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import hashlib
import json
from collections.abc import Sequence

from kv_directory.profile import CostProfile
from kv_directory.states import Outcome, TxnState


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
    by name; tests/unit/test_directory_convert.py checks)."""

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
    grpc_addr: str
    data_addr: str
    abi_digest: str
    """Digest of the worker's cache ABI; routes pair only equal digests."""
    capacity: WorkerCapacity = WorkerCapacity()
    profile: CostProfile = CostProfile()
    """Cost model measured at start (empty when the worker declares none)."""
    colocated_only_reason: str = ""
    """Why the worker serves colocated requests only and never exchanges K/V (its
    start-up kernel self-check failed); empty: hand-offs allowed."""

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise ValueError("worker_id must be non-empty")
        object.__setattr__(self, "role", WorkerRole(self.role))


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A registered, live worker as the directory sees it."""

    worker_id: str
    role: WorkerRole
    grpc_addr: str
    data_addr: str
    abi_digest: str
    epoch: int
    """Bumped on every registration; fences everything the previous process did."""
    lease_expiry_ms: int
    """Store clock; the worker is dead at or after this instant."""
    load: LoadReport
    capacity: WorkerCapacity = WorkerCapacity()
    profile: CostProfile = CostProfile()
    colocated_only_reason: str = ""
    """As declared at registration (WorkerInfo.colocated_only_reason)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", WorkerRole(self.role))

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
class ClusterSnapshot:
    """Live workers (sorted by id) and the route epoch, read atomically."""

    route_epoch: int
    now_ms: int
    workers: tuple[WorkerRecord, ...]

    def worker(self, worker_id: str) -> WorkerRecord | None:
        """The live record of ``worker_id``, or None."""
        return next((w for w in self.workers if w.worker_id == worker_id), None)


def digest_checksums(chunk_checksums: Sequence[str]) -> str:
    """Order-sensitive digest of a manifest's per-chunk checksums (hex sha256)."""
    h = hashlib.sha256()
    for c in chunk_checksums:
        h.update(c.encode())
        h.update(b"\n")  # separator: ("ab","c") and ("a","bc") must differ
    return h.hexdigest()


@dataclasses.dataclass(frozen=True, slots=True)
class TransferSpec:
    """The immutable identity of one transfer, fixed at reserve time.

    A retry with the same transfer id is idempotent only if every field here is
    equal; otherwise it is CHECKSUM_CONFLICT (corruption, article 0x06A).
    """

    transfer_id: str
    request_id: str
    tenant: str
    generation: int
    """Attempt number of the request; a newer one supersedes older ones."""
    source: WorkerRef
    dest: WorkerRef
    manifest_digest: str
    chunk_checksums: tuple[str, ...] = ()
    """Optional; when given, ``manifest_digest`` must be their ``digest_checksums``."""
    route_epoch: int = 0
    """Route epoch the route was chosen under; 0 = not checked."""
    manifest_blob: str = dataclasses.field(default="", compare=False)
    """Opaque text stored with the transaction and returned by ``lookup`` (the
    gRPC layer keeps the full manifest here). Not part of the identity: put a
    digest of whatever identifies the transfer in ``manifest_digest``."""

    def __post_init__(self) -> None:
        for name in ("transfer_id", "request_id", "tenant", "manifest_digest"):
            if not getattr(self, name):
                raise ValueError(f"TransferSpec.{name} must be non-empty")
        if self.generation < 1 or self.route_epoch < 0:
            raise ValueError("generation must be >= 1 and route_epoch >= 0")
        object.__setattr__(self, "chunk_checksums", tuple(self.chunk_checksums))
        if self.chunk_checksums and digest_checksums(self.chunk_checksums) != self.manifest_digest:
            raise ValueError("manifest_digest does not match chunk_checksums")

    def checksums_json(self) -> str:
        """Checksums as stored (a JSON list; Lua treats it as an opaque string)."""
        return json.dumps(list(self.chunk_checksums))


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


@dataclasses.dataclass(frozen=True, slots=True)
class EpochResult:
    """Outcome of a route-epoch change and the epoch now current."""

    outcome: Outcome
    route_epoch: int


def normalize_hashes(hashes: Sequence[bytes | str], limit: int) -> list[str]:
    """Prefix block hashes as lowercase hex strings (the stored form)."""
    if len(hashes) > limit:
        raise ValueError(f"{len(hashes)} prefix blocks exceed the limit of {limit}")
    out = []
    for h in hashes:
        s = h.hex() if isinstance(h, (bytes, bytearray)) else h.lower()
        if not s or any(c not in "0123456789abcdef" for c in s):
            raise ValueError(f"prefix hash is not bytes or hex: {h!r}")
        out.append(s)
    return out


class WorkerRegistry(abc.ABC):
    """Worker membership: epochs and leases."""

    @abc.abstractmethod
    def register_worker(self, info: WorkerInfo, load: LoadReport | None = None) -> WorkerRecord:
        """Start a new epoch for ``info.worker_id`` (``next_fence``: strictly greater than
        any before, even across a data loss) and abort every unpublished transaction of
        its previous epochs."""

    @abc.abstractmethod
    def heartbeat(self, worker_id: str, epoch: int, load: LoadReport) -> LeaseResult:
        """Extend the lease and replace the load report; LEASE_LOST if ``epoch`` is
        not the live epoch (stale, expired or reaped) — the worker must re-register."""

    @abc.abstractmethod
    def deregister_worker(self, worker_id: str, epoch: int) -> Outcome:
        """Graceful leave: as if the lease expired now. LEASE_LOST if not live at ``epoch``."""

    @abc.abstractmethod
    def reap_expired(self) -> int:
        """Drop expired workers (aborting their unpublished transactions) and abort
        overdue transactions now, without waiting for traffic; returns how many."""

    @abc.abstractmethod
    def snapshot(self) -> ClusterSnapshot:
        """Live workers with their loads, and the route epoch."""


class TransferLedger(abc.ABC):
    """Transfer transactions (states.py draws the machine)."""

    @abc.abstractmethod
    def reserve(self, spec: TransferSpec) -> TxnResult:
        """Create the transaction in RESERVED. Rejections: DUPLICATE (same id and
        identity: idempotent, returns the stored txn), CHECKSUM_CONFLICT (same id,
        other identity or digest), LEASE_LOST (an end is not live at its epoch),
        STALE_GENERATION (not newer than the request's current generation, or an
        old route epoch). Supersedes (aborts) older unpublished generations."""

    @abc.abstractmethod
    def begin(self, transfer_id: str) -> TxnResult:
        """RESERVED -> TRANSFERRING.

        Forward moves (begin, validated, publish) share one rule set: DUPLICATE
        if already in the target state; on an ABORTED transaction, the cause of
        the abort (``ABORT_OUTCOMES``: STALE_GENERATION if superseded,
        LEASE_LOST if a lease or deadline ran out, else ILLEGAL_TRANSITION);
        LEASE_LOST (and abort) if the destination is no longer live at its
        epoch; ILLEGAL_TRANSITION if ``check_transition`` says no."""

    @abc.abstractmethod
    def validated(self, transfer_id: str) -> TxnResult:
        """TRANSFERRING -> VALIDATED (every chunk checked and device-visible)."""

    @abc.abstractmethod
    def publish(self, transfer_id: str, generation: int) -> TxnResult:
        """VALIDATED -> PUBLISHED iff ``generation`` is the transaction's and the
        request's current generation (compare-and-set) and the destination is
        live at its epoch. DUPLICATE if already published/released.
        STALE_GENERATION if ``generation`` is not the transaction's (nothing
        changes) or a newer generation was reserved (the transaction was
        aborted as ``superseded``); LEASE_LOST if the destination is not live
        (the transaction is aborted); ILLEGAL_TRANSITION from other states."""

    @abc.abstractmethod
    def abort(self, transfer_id: str, reason: str) -> TxnResult:
        """Any unpublished state -> ABORTED; DUPLICATE if already aborted;
        ILLEGAL_TRANSITION once published."""

    @abc.abstractmethod
    def release(self, transfer_id: str) -> TxnResult:
        """PUBLISHED -> RELEASED (source may free its copy); DUPLICATE if released."""

    @abc.abstractmethod
    def lookup(self, transfer_id: str) -> Transaction | None:
        """The stored transaction, or None (never existed, or retention ran out)."""

    @abc.abstractmethod
    def list_open(self, worker_id: str | None = None) -> list[Transaction]:
        """Unpublished transactions (optionally touching ``worker_id``), by transfer id."""


class PrefixIndex(abc.ABC):
    """Where hash-chained prefix blocks live, per tenant (article 0x09G)."""

    @abc.abstractmethod
    def prefix_publish(self, tenant: str, worker_id: str, epoch: int, hashes: Sequence[bytes | str],
                       evicted: Sequence[bytes | str] = ()) -> Outcome:
        """Record that ``worker_id@epoch`` holds ``hashes`` and no longer holds
        ``evicted`` (evictions apply first, so a hash in both is held);
        LEASE_LOST if not live."""

    @abc.abstractmethod
    def prefix_lookup(self, tenant: str, hashes: Sequence[bytes | str]) -> dict[str, int]:
        """For each live worker, how many *leading* blocks of ``hashes`` it holds
        (only workers with at least one). Dead or stale epochs never count."""


def next_fence(current: int, now_ms: int) -> int:
    """The fence after `current` (a worker epoch, the route epoch) at store time `now_ms`.

    Safety invariant: fences never move backwards, even when the backend lost its
    data (Redis restarted without its files): a new fence is at least the store's
    clock in ms, and every fence was issued at or before its own issue time, so it
    is below any later `now_ms`. Must match next_fence in lua/_lib.lua.
    """
    return max(current + 1, now_ms)


class RouteEpochs(abc.ABC):
    """The cluster-wide route epoch (rollback step ADVANCE_ROUTE_EPOCH)."""

    @abc.abstractmethod
    def get_route_epoch(self) -> int:
        """Current route epoch: the store's clock in ms when it was first read or last
        advanced (never smaller than an epoch read before, see ``next_fence``)."""

    @abc.abstractmethod
    def advance_route_epoch(self, expected: int | None = None) -> EpochResult:
        """Advance the epoch (``next_fence``); with ``expected``, only if it is still
        current (else STALE_GENERATION and the current value)."""


class NonceLedger(abc.ABC):
    """Single-use capability nonces."""

    @abc.abstractmethod
    def consume_nonce(self, nonce: str, ttl_s: float) -> Outcome:
        """APPLIED the first time within ``ttl_s``, DUPLICATE (a replay) after."""


class DirectoryStore(WorkerRegistry, TransferLedger, PrefixIndex, RouteEpochs, NonceLedger):
    """All directory roles over one backend: ``RedisDirectoryStore`` or
    ``MemoryDirectoryStore``. Thread-safe."""

    def ping(self) -> None:
        """Readiness probe: return if the backend can serve, else raise DirectoryUnavailable."""

    def close(self) -> None:
        """Release backend resources (connections)."""

    def __enter__(self) -> DirectoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
