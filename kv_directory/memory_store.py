"""In-process ``DirectoryStore``: the same semantics as the Redis store, for unit tests.

Every public method holds one lock for its whole body, which plays the role a
Lua script plays in Redis: the sweep, the checks and the writes of one call are
one atomic step. The clock is injectable so lease tests need not sleep.

The rules are written to mirror ``lua/*.lua`` line for line; when changing one,
change the other and run the shared contract (tests/support/directory/contract.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from kv_directory.config import DirectoryConfig
from kv_directory.store import DirectoryStore, next_fence
from services.directory.records import (
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
    WorkerRef,
)
from services.directory.states import ABORT_OUTCOMES, Outcome, TxnState, check_transition


@dataclasses.dataclass(slots=True)
class _Request:
    """Per-(tenant, request id) generation register: the publish CAS target."""

    generation: int
    published_transfer_id: str = ""
    expires_ms: int = 0


class MemoryDirectoryStore(DirectoryStore):
    """Thread-safe dict-backed directory. ``clock`` returns seconds."""

    def __init__(self, config: DirectoryConfig | None = None, clock: Callable[[], float] = time.time):
        self._cfg = config or DirectoryConfig()
        self._clock = clock
        self._lock = threading.Lock()
        self._epochs: dict[str, int] = {}  # never shrinks: epochs stay monotonic
        self._seal_keys: dict[str, tuple[int, bytes]] = {}  # worker -> (epoch, its seal key)
        self._workers: dict[str, WorkerRecord] = {}
        self._txns: dict[str, Transaction] = {}
        self._forget_at_ms: dict[str, int] = {}  # terminal txn -> retention end
        self._requests: dict[tuple[str, str], _Request] = {}
        self._route_epoch: int | None = None  # created at the first read (_route_epoch_at)
        self._nonces: dict[str, tuple[int, str]] = {}  # nonce -> (expiry, attempt that consumed it)
        self._reserved_by: dict[str, str] = {}  # transfer id -> attempt that reserved it
        self._release: StoredRelease | None = None
        self._pubs: dict[int, int] = {}  # route epoch -> publications under it

    # ---- helpers (call with the lock held) -------------------------------

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _route_epoch_at(self, now: int) -> int:
        """The route epoch, created at `now` when missing (as the Redis store does)."""
        if self._route_epoch is None:
            self._route_epoch = now
        return self._route_epoch

    def _ms(self, seconds: float) -> int:
        return int(seconds * 1000)

    def _live(self, ref: WorkerRef) -> bool:
        w = self._workers.get(ref.worker_id)
        return w is not None and w.epoch == ref.epoch

    def _set(self, t: Transaction, now: int, state: TxnState, reason: str = "",
             kv_digest: str = "") -> Transaction:
        t = dataclasses.replace(t, state=state, updated_ms=now, abort_reason=reason or t.abort_reason,
                                kv_digest=t.kv_digest or kv_digest)
        self._txns[t.transfer_id] = t
        if state.is_terminal:
            self._forget_at_ms[t.transfer_id] = now + self._ms(self._cfg.record_retention_s)
        return t

    def _abort(self, t: Transaction, now: int, reason: str) -> Transaction:
        assert t.state.is_unpublished, t
        return self._set(t, now, TxnState.ABORTED, reason)

    def _abort_touching(self, worker_id: str, now: int, reason: str) -> int:
        n = 0
        for t in list(self._txns.values()):
            if t.state.is_unpublished and worker_id in (t.spec.source.worker_id, t.spec.dest.worker_id):
                self._abort(t, now, reason)
                n += 1
        return n

    def _release_held(self, worker_id: str, now: int, reason: str) -> int:
        """Release the PUBLISHED transactions whose K/V `worker_id` held (it is gone)."""
        held = [t for t in self._txns.values()
                if t.state == TxnState.PUBLISHED and t.spec.dest.worker_id == worker_id]
        for t in held:
            self._set(t, now, TxnState.RELEASED, f"decode worker gone: {reason}")
        return len(held)

    def _drop_worker(self, worker_id: str, now: int, reason: str) -> int:
        del self._workers[worker_id]
        return 1 + self._abort_touching(worker_id, now, reason) + self._release_held(worker_id, now, reason)

    def _sweep(self) -> tuple[int, int]:
        """Lazy reaping, run first by every call; returns (now_ms, items reaped)."""
        now, n = self._now_ms(), 0
        for w in [w for w in self._workers.values() if w.lease_expiry_ms <= now]:
            n += self._drop_worker(w.worker_id, now, "lease_expired")
        for t in [t for t in self._txns.values() if t.state.is_unpublished and t.deadline_ms <= now]:
            self._abort(t, now, "txn_timeout")
            n += 1
        for tid in [tid for tid, at in self._forget_at_ms.items() if at <= now]:
            del self._txns[tid], self._forget_at_ms[tid]
            self._reserved_by.pop(tid, None)
        for key in [k for k, r in self._requests.items() if r.expires_ms <= now]:
            del self._requests[key]
        for key in [k for k, (at, _) in self._nonces.items() if at <= now]:
            del self._nonces[key]
        return now, n

    def _request(self, t: Transaction) -> _Request | None:
        return self._requests.get((t.spec.tenant, t.spec.request_id))

    def _touch_request(self, req: _Request, now: int) -> None:
        # Must outlive every open transaction of the request (see redis_store).
        req.expires_ms = now + self._ms(self._cfg.txn_ttl_s + self._cfg.record_retention_s)

    def _forward(self, transfer_id: str, target: TxnState, generation: int | None = None,
                 kv_digest: str = "", chunks_digest: str = "") -> TxnResult:
        """begin / validated / publish: the shared rule order of store.TransferLedger.begin."""
        now, _ = self._sweep()
        t = self._txns.get(transfer_id)
        if t is None:
            return TxnResult(Outcome.NOT_FOUND, None)
        if generation is not None and generation != t.generation:
            return TxnResult(Outcome.STALE_GENERATION, t)
        if t.state == TxnState.ABORTED:
            return TxnResult(ABORT_OUTCOMES.get(t.abort_reason, Outcome.ILLEGAL_TRANSITION), t)
        req = self._request(t)
        if req is not None and req.generation > t.generation:
            if t.state.is_unpublished:
                t = self._abort(t, now, "superseded")
            return TxnResult(Outcome.STALE_GENERATION, t)
        if kv_digest and t.kv_digest and kv_digest != t.kv_digest:
            return TxnResult(Outcome.CHECKSUM_CONFLICT, t)
        if target == TxnState.VALIDATED and chunks_digest != t.spec.chunks_digest:
            return TxnResult(Outcome.CHECKSUM_CONFLICT, t)
        if t.state == target or (target == TxnState.PUBLISHED and t.state == TxnState.RELEASED):
            if target == TxnState.TRANSFERRING and kv_digest and not t.kv_digest:
                return TxnResult(Outcome.APPLIED, self._set(t, now, target, kv_digest=kv_digest))
            return TxnResult(Outcome.DUPLICATE, t)
        if t.state.is_unpublished and not self._live(t.spec.dest):
            return TxnResult(Outcome.LEASE_LOST, self._abort(t, now, "dest_lease_lost"))
        if t.state.is_unpublished and 0 < t.spec.route_epoch < self._route_epoch_at(now):
            return TxnResult(Outcome.STALE_GENERATION, self._abort(t, now, "route_epoch_retired"))
        if not check_transition(t.state, target):
            return TxnResult(Outcome.ILLEGAL_TRANSITION, t)
        if target != TxnState.TRANSFERRING and (not t.kv_digest or kv_digest != t.kv_digest):
            return TxnResult(Outcome.CHECKSUM_CONFLICT, t)
        t = self._set(t, now, target, kv_digest=kv_digest)
        if target == TxnState.PUBLISHED:
            self._pubs[t.spec.route_epoch] = self._pubs.get(t.spec.route_epoch, 0) + 1
        if target == TxnState.PUBLISHED and req is not None:
            req.published_transfer_id = t.transfer_id
            self._touch_request(req, now)
        return TxnResult(Outcome.APPLIED, t)

    # ---- WorkerRegistry ----------------------------------------------------

    def register_worker(self, info: WorkerInfo, load: LoadReport | None = None) -> WorkerRecord:
        """See ``WorkerRegistry.register_worker``."""
        with self._lock:
            now, _ = self._sweep()
            epoch = next_fence(self._epochs.get(info.worker_id, 0), now)
            self._epochs[info.worker_id] = epoch
            self._abort_touching(info.worker_id, now, "worker_restarted")
            self._release_held(info.worker_id, now, "worker_restarted")
            rec = WorkerRecord(
                info.worker_id, info.role, info.grpc_address, info.data_plane_address, info.cache_abi_digest,
                info.capacity, load or LoadReport(), epoch, now + self._ms(self._cfg.lease_ttl_s),
                info.profile, info.colocated_only_reason, info.model_identity, info.seal_key, now,
            )
            self._workers[info.worker_id] = rec
            self._seal_keys[info.worker_id] = (epoch, info.seal_key)
            return rec

    def seal_key(self, worker_id: str, epoch: int) -> bytes:
        """See ``WorkerRegistry.seal_key``."""
        with self._lock:
            held, key = self._seal_keys.get(worker_id, (0, b""))
            w = self._workers.get(worker_id)
            return key if held == epoch and w is not None and w.epoch == epoch else b""

    def heartbeat(self, worker_id: str, epoch: int, load: LoadReport) -> LeaseResult:
        """See ``WorkerRegistry.heartbeat``."""
        with self._lock:
            now, _ = self._sweep()
            w = self._workers.get(worker_id)
            stopped = self._release is not None and self._release.head.routes_stopped
            if w is None or w.epoch != epoch:
                return LeaseResult(Outcome.LEASE_LOST, 0, stopped)
            exp = now + self._ms(self._cfg.lease_ttl_s)
            self._workers[worker_id] = w = dataclasses.replace(w, lease_expiry_ms=exp, load=load, load_reported_ms=now)
            return LeaseResult(Outcome.APPLIED, w.lease_expiry_ms, stopped)

    def deregister_worker(self, worker_id: str, epoch: int) -> Outcome:
        """See ``WorkerRegistry.deregister_worker``."""
        with self._lock:
            now, _ = self._sweep()
            w = self._workers.get(worker_id)
            if w is None or w.epoch != epoch:
                return Outcome.LEASE_LOST
            self._drop_worker(worker_id, now, "worker_deregistered")
            return Outcome.APPLIED

    def reap_expired(self) -> int:
        """See ``WorkerRegistry.reap_expired``."""
        with self._lock:
            return self._sweep()[1]

    def snapshot(self) -> ClusterSnapshot:
        """See ``WorkerRegistry.snapshot``."""
        with self._lock:
            now, _ = self._sweep()
            workers = tuple(sorted(self._workers.values(), key=lambda w: w.worker_id))
            head = self._release.head if self._release is not None else ReleaseHead()
            return ClusterSnapshot(workers, self._route_epoch_at(now), now, head)

    # ---- TransferLedger ----------------------------------------------------

    def reserve(self, spec: TransferSpec, attempt: str = "") -> TxnResult:
        """See ``TransferLedger.reserve``."""
        with self._lock:
            now, _ = self._sweep()
            key = (spec.tenant, spec.request_id)
            req = self._requests.get(key)
            cur = req.generation if req is not None else 0
            old = self._txns.get(spec.transfer_id)
            if old is not None and old.spec != spec:
                return TxnResult(Outcome.CHECKSUM_CONFLICT, old, cur)
            if old is not None:  # its own run repeated (the same attempt), or another call's
                again = attempt != "" and self._reserved_by.get(spec.transfer_id) == attempt
                return TxnResult(Outcome.APPLIED if again else Outcome.DUPLICATE, old, cur)
            if self._release is not None and self._release.head.routes_stopped:
                return TxnResult(Outcome.ROUTES_STOPPED, None, cur)
            if spec.route_epoch and spec.route_epoch < self._route_epoch_at(now):
                return TxnResult(Outcome.STALE_GENERATION, None, cur)
            if not (self._live(spec.source) and self._live(spec.dest)):
                return TxnResult(Outcome.LEASE_LOST, None, cur)
            if req is not None and req.generation >= spec.generation:
                return TxnResult(Outcome.STALE_GENERATION, None, cur)
            for t in list(self._txns.values()):
                if t.state.is_unpublished and (t.spec.tenant, t.spec.request_id) == key:
                    self._abort(t, now, "superseded")
            req = self._requests.setdefault(key, _Request(spec.generation))
            req.generation = spec.generation  # keeps published_transfer_id, as the Redis hash does
            self._touch_request(req, now)
            t = Transaction(spec, TxnState.RESERVED, "", now, now, now + self._ms(self._cfg.txn_ttl_s))
            self._txns[spec.transfer_id], self._reserved_by[spec.transfer_id] = t, attempt
            return TxnResult(Outcome.APPLIED, t, spec.generation)

    def begin(self, transfer_id: str, kv_digest: str = "") -> TxnResult:
        """See ``TransferLedger.begin``."""
        with self._lock:
            return self._forward(transfer_id, TxnState.TRANSFERRING, kv_digest=kv_digest)

    def validated(self, transfer_id: str, kv_digest: str, chunks_digest: str) -> TxnResult:
        """See ``TransferLedger.validated``."""
        with self._lock:
            return self._forward(transfer_id, TxnState.VALIDATED, kv_digest=kv_digest, chunks_digest=chunks_digest)

    def publish(self, transfer_id: str, generation: int, kv_digest: str) -> TxnResult:
        """See ``TransferLedger.publish``."""
        with self._lock:
            return self._forward(transfer_id, TxnState.PUBLISHED, generation, kv_digest)

    def validate_publish(self, transfer_id: str, generation: int, kv_digest: str,
                         chunks_digest: str, declare: bool = False) -> TxnResult:
        """See ``TransferLedger.validate_publish``."""
        with self._lock:
            t = self._txns.get(transfer_id)
            if t is None or t.state not in (TxnState.VALIDATED, TxnState.PUBLISHED, TxnState.RELEASED):
                if declare:
                    r = self._forward(transfer_id, TxnState.TRANSFERRING, kv_digest=kv_digest)
                    if r.outcome not in (Outcome.APPLIED, Outcome.DUPLICATE):
                        return r
                r = self._forward(transfer_id, TxnState.VALIDATED, kv_digest=kv_digest, chunks_digest=chunks_digest)
                if r.outcome not in (Outcome.APPLIED, Outcome.DUPLICATE):
                    return r
            return self._forward(transfer_id, TxnState.PUBLISHED, generation, kv_digest)

    def abort(self, transfer_id: str, reason: str) -> TxnResult:
        """See ``TransferLedger.abort``."""
        return self._end(transfer_id, TxnState.ABORTED, reason or "aborted")

    def release(self, transfer_id: str) -> TxnResult:
        """See ``TransferLedger.release``."""
        return self._end(transfer_id, TxnState.RELEASED, "")

    def _end(self, transfer_id: str, state: TxnState, reason: str) -> TxnResult:
        """`transfer_id` to the terminal `state` (abort and release)."""
        with self._lock:
            now, _ = self._sweep()
            t = self._txns.get(transfer_id)
            if t is None:
                return TxnResult(Outcome.NOT_FOUND, None)
            if t.state == state:
                return TxnResult(Outcome.DUPLICATE, t)
            if not check_transition(t.state, state):
                return TxnResult(Outcome.ILLEGAL_TRANSITION, t)
            return TxnResult(Outcome.APPLIED, self._set(t, now, state, reason))

    def lookup(self, transfer_id: str) -> Transaction | None:
        """See ``TransferLedger.lookup``."""
        with self._lock:
            self._sweep()
            return self._txns.get(transfer_id)

    def list_open(self, worker_id: str | None = None) -> list[Transaction]:
        """See ``TransferLedger.list_open``."""
        with self._lock:
            self._sweep()
            return sorted(
                (
                    t for t in self._txns.values()
                    if t.state.is_unpublished
                    and worker_id in (None, t.spec.source.worker_id, t.spec.dest.worker_id)
                ),
                key=lambda t: t.transfer_id,
            )

    def all_transactions(self) -> list[Transaction]:
        """Every stored record, for leak checks in tests."""
        with self._lock:
            return list(self._txns.values())

    # ---- RouteEpochs / NonceLedger ----------------------------------------

    def get_route_epoch(self) -> int:
        """See ``RouteEpochs.get_route_epoch``."""
        with self._lock:
            now, _ = self._sweep()
            return self._route_epoch_at(now)

    def advance_route_epoch(self, expected: int | None = None) -> EpochResult:
        """See ``RouteEpochs.advance_route_epoch``."""
        with self._lock:
            now, _ = self._sweep()
            cur = self._route_epoch_at(now)
            if expected is not None and expected != cur:
                return EpochResult(Outcome.STALE_GENERATION, cur)
            self._route_epoch = next_fence(cur, now)
            return EpochResult(Outcome.APPLIED, self._route_epoch, self._pubs.get(cur, 0))

    def publications(self, route_epoch: int) -> int:
        """See ``RouteEpochs.publications``."""
        with self._lock:
            return self._pubs.get(route_epoch, 0)

    def consume_nonce(self, nonce: str, ttl_s: float, route_epoch: int = 0, attempt: str = "") -> Outcome:
        """See ``NonceLedger.consume_nonce``."""
        if not nonce or ttl_s <= 0:
            raise ValueError("nonce must be non-empty and ttl_s > 0")
        with self._lock:
            now, _ = self._sweep()
            if route_epoch and route_epoch != self._route_epoch_at(now):
                return Outcome.STALE_GENERATION
            if nonce in self._nonces:
                return Outcome.APPLIED if attempt and self._nonces[nonce][1] == attempt else Outcome.DUPLICATE
            self._nonces[nonce] = (now + self._ms(ttl_s), attempt)
            return Outcome.APPLIED

    # ---- ReleaseLedger -------------------------------------------------------

    def get_release(self) -> StoredRelease | None:
        """See ``ReleaseLedger.get_release``."""
        with self._lock:
            return self._release

    def put_release(self, expected_version: int, head: ReleaseHead,
                    record: bytes) -> tuple[Outcome, StoredRelease | None]:
        """See ``ReleaseLedger.put_release``."""
        with self._lock:
            current = self._release.head.version if self._release is not None else 0
            if current != expected_version:
                return Outcome.STALE_GENERATION, self._release
            self._release = StoredRelease(head, record)
            return Outcome.APPLIED, self._release
