"""The in-process directory's worker registry (store.py WorkerRegistry): epochs, leases,
seal keys, the cluster snapshot. A mixin of MemoryDirectoryStore (memory_store.py), whose
lock, state and helpers it uses; every method holds the lock for its whole body."""

from __future__ import annotations

import dataclasses

from kv_directory.store import next_fence
from runtime.directory.records import ClusterSnapshot, LeaseResult, LoadReport, ReleaseHead, WorkerInfo, WorkerRecord
from runtime.directory.states import Outcome


class MemoryRegistry:
    """WorkerRegistry of MemoryDirectoryStore."""

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
