"""In-process ``DirectoryStore``: the same semantics as the Redis store, for unit tests.

Every public method holds one lock for its whole body, which plays the role a
Lua script plays in Redis: the sweep, the checks and the writes of one call are
one atomic step. The clock is injectable so lease tests need not sleep.

The rules are written to mirror ``lua/*.lua`` line for line; when changing one,
change the other and run the shared contract (tests/support/directory/contract.py).
The roles store.py declares are split by file: the worker registry (memory_registry.py),
the transfer ledger (memory_ledger.py); route epochs, nonces and the release record, and
the state and helpers every role shares, stay here.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from kv_directory.config import DirectoryConfig
from kv_directory.memory_ledger import MemoryLedger, RequestRegister
from kv_directory.memory_registry import MemoryRegistry
from kv_directory.store import DirectoryStore, next_fence
from runtime.directory.records import (
    EpochResult,
    ReleaseHead,
    StoredRelease,
    Transaction,
    WorkerRecord,
    WorkerRef,
)
from runtime.directory.states import Outcome, TxnState


class MemoryDirectoryStore(MemoryRegistry, MemoryLedger, DirectoryStore):
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
        self._requests: dict[tuple[str, str], RequestRegister] = {}
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

    def _request(self, t: Transaction) -> RequestRegister | None:
        return self._requests.get((t.spec.tenant, t.spec.request_id))

    def _touch_request(self, req: RequestRegister, now: int) -> None:
        # Must outlive every open transaction of the request (see redis_store).
        req.expires_ms = now + self._ms(self._cfg.txn_ttl_s + self._cfg.record_retention_s)

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
