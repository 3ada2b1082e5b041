"""The in-process directory's transfer ledger (store.py TransferLedger): reserve, begin,
validated, publish, abort, release, lookup. A mixin of MemoryDirectoryStore
(memory_store.py), whose lock, state and helpers it uses; every public method holds the
lock for its whole body, as a Lua script is one step in Redis."""

from __future__ import annotations

import dataclasses

from runtime.directory.records import Transaction, TransferSpec, TxnResult
from runtime.directory.states import ABORT_OUTCOMES, Outcome, TxnState, check_transition


@dataclasses.dataclass(slots=True)
class RequestRegister:
    """Per-(tenant, request id) generation register: the publish CAS target."""

    generation: int
    published_transfer_id: str = ""
    expires_ms: int = 0


class MemoryLedger:
    """TransferLedger of MemoryDirectoryStore."""

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
            req = self._requests.setdefault(key, RequestRegister(spec.generation))
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
