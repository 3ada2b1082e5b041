"""The directory's domain records and its storage interface, split by role.

Who calls what (the gRPC servicer maps one RPC to one method):

* ``WorkerRegistry``   — workers: register at start, heartbeat, deregister;
  the router reads ``snapshot()``.
* ``TransferLedger``   — the router reserves a transaction, the prefill worker
  begins it, the decode worker marks it validated, publishes it and releases
  it when the sequence ends; anyone on a failure path calls ``abort`` (the
  owners are written once, in docs/design.md "The transaction").
* ``RouteEpochs``      — the router's rollback path advances the route epoch.
* ``NonceLedger``      — capability checks consume a nonce exactly once.
* ``ReleaseLedger``    — the release record (runtime/release), compare-and-set on
  its version; while it says routes are stopped, ``reserve`` answers ROUTES_STOPPED.

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

from runtime.directory.records import (
    ClusterSnapshot,
    EpochResult,
    LeaseResult,
    LoadReport,
    ReleaseHead,
    StoredRelease,
    Transaction,
    TransferSpec,
    TxnResult,
    WorkerInfo,
    WorkerRecord,
)
from runtime.directory.states import Outcome


class WorkerRegistry(abc.ABC):
    """Worker membership: epochs and leases."""

    @abc.abstractmethod
    def register_worker(self, info: WorkerInfo, load: LoadReport | None = None) -> WorkerRecord:
        """Start a new epoch for ``info.worker_id`` (``next_fence``: strictly greater than
        any before, even across a data loss) and abort every unpublished transaction of
        its previous epochs."""

    @abc.abstractmethod
    def seal_key(self, worker_id: str, epoch: int) -> bytes:
        """The seal key ``worker_id`` registered for ``epoch`` (runtime/security/seal.py);
        b'' when it registered none, or ``epoch`` is not its current one."""

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
    def reserve(self, spec: TransferSpec, attempt: str = "") -> TxnResult:
        """Create the transaction in RESERVED. Rejections: DUPLICATE (same id and
        identity: idempotent, returns the stored txn; APPLIED again when the stored one
        was reserved under the same non-empty ``attempt``, the caller's token for one
        call: its own run repeated after a lost reply), CHECKSUM_CONFLICT (same id,
        other identity or digest), ROUTES_STOPPED (a rollback stopped new routes),
        LEASE_LOST (an end is not live at its epoch), STALE_GENERATION (not newer
        than the request's current generation, or an old route epoch). Supersedes
        (aborts) older unpublished generations."""

    @abc.abstractmethod
    def begin(self, transfer_id: str, kv_digest: str = "") -> TxnResult:
        """RESERVED -> TRANSFERRING, and the source's declaration of the prompt's
        K/V digest once it has computed it: in this call or in a second ``begin``
        while TRANSFERRING (APPLIED: recorded). The digest is written once.

        Forward moves (begin, validated, publish) share one rule order: on an
        ABORTED transaction, the cause of the abort (``ABORT_OUTCOMES``:
        STALE_GENERATION if superseded or its route epoch retired, LEASE_LOST if
        a lease or deadline ran out, else ILLEGAL_TRANSITION); STALE_GENERATION
        (and abort) if a newer generation was reserved; CHECKSUM_CONFLICT if a
        digest is given that is not the declared one, or (validated) the chunk
        layout is not the reserved one; DUPLICATE if already in the target state;
        LEASE_LOST (and abort) if the destination is no longer live at its epoch;
        STALE_GENERATION (and abort) if it was reserved under a route epoch that
        has since advanced (a rollback retired it: nothing publishes under it);
        ILLEGAL_TRANSITION if ``check_transition`` says no; CHECKSUM_CONFLICT
        (validated, publish) if no digest was declared or the caller's is not it."""

    @abc.abstractmethod
    def validated(self, transfer_id: str, kv_digest: str, chunks_digest: str) -> TxnResult:
        """TRANSFERRING -> VALIDATED: the destination holds every chunk, and
        ``kv_digest`` (its digest of what it holds) is the source's declared one
        and ``chunks_digest`` (``chunk_list_digest`` of what it received) is the
        spec's; else CHECKSUM_CONFLICT and nothing changes."""

    @abc.abstractmethod
    def publish(self, transfer_id: str, generation: int, kv_digest: str) -> TxnResult:
        """VALIDATED -> PUBLISHED iff ``generation`` is the transaction's and the
        request's current generation (compare-and-set), ``kv_digest`` is the one
        validated, and the destination is live at its epoch. DUPLICATE if
        already published/released. STALE_GENERATION if ``generation`` is not
        the transaction's (nothing changes) or a newer generation was reserved
        (the transaction was aborted as ``superseded``); CHECKSUM_CONFLICT for
        another digest; LEASE_LOST if the destination is not live (the
        transaction is aborted); ILLEGAL_TRANSITION from other states."""

    @abc.abstractmethod
    def validate_publish(self, transfer_id: str, generation: int, kv_digest: str,
                         chunks_digest: str, declare: bool = False) -> TxnResult:
        """``validated`` then ``publish`` in one atomic step (the destination's one
        round trip): the first answer other than APPLIED or DUPLICATE is returned and
        nothing after it is applied. A transaction already VALIDATED only publishes;
        one already published answers as ``publish`` does (DUPLICATE). With
        ``declare`` (the caller checked the source's seal over ``kv_digest``), a
        ``begin(transfer_id, kv_digest)`` goes first in the same step, so a transaction
        still RESERVED, or TRANSFERRING with no declaration yet, is declared by it."""

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
        current (else STALE_GENERATION and the current value). Reports the publications
        made under the epoch it retired, counted in the same atomic step."""

    @abc.abstractmethod
    def publications(self, route_epoch: int) -> int:
        """Transactions published under `route_epoch` (reserved with it) so far."""


class NonceLedger(abc.ABC):
    """Single-use capability nonces."""

    @abc.abstractmethod
    def consume_nonce(self, nonce: str, ttl_s: float, route_epoch: int = 0, attempt: str = "") -> Outcome:
        """APPLIED the first time within ``ttl_s``, DUPLICATE (a replay) after, except to
        the call that consumed it run again (the same non-empty ``attempt``: APPLIED);
        STALE_GENERATION (nothing consumed) when ``route_epoch`` is set and is not the
        current route epoch — in the same atomic step."""


class ReleaseLedger(abc.ABC):
    """The release record every router follows (docs/design.md, The release). The store keeps it
    opaque (the servicer decodes it and checks the transition); it reads only the head."""

    @abc.abstractmethod
    def get_release(self) -> StoredRelease | None:
        """The stored record, or None while none was written."""

    @abc.abstractmethod
    def put_release(self, expected_version: int, head: ReleaseHead,
                    record: bytes) -> tuple[Outcome, StoredRelease | None]:
        """Store `record` iff the stored version is `expected_version` (0: none stored):
        APPLIED; else STALE_GENERATION and nothing changes. Returns the stored record after."""


class DirectoryStore(WorkerRegistry, TransferLedger, RouteEpochs, NonceLedger, ReleaseLedger):
    """All directory roles over one backend: ``RedisDirectoryStore`` or
    ``MemoryDirectoryStore``. Thread-safe."""

    def ping(self) -> None:
        """Readiness probe: return if the backend can serve, else raise DirectoryUnavailable."""

    def close(self) -> None:
        """Release backend resources (connections)."""

    def inline_twin(self, budget_s: float) -> DirectoryStore | None:
        """This store with every backend call giving up (DirectoryUnavailable) after
        `budget_s` and never retrying, for calls made on the event loop
        (kv_directory/store_calls.py); None: this store has none (every call pooled)."""
        return None

    def __enter__(self) -> DirectoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
