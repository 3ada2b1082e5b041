"""Directory membership of a worker: register with a lease, heartbeat the load.

Every start registers anew and gets a new epoch. If a heartbeat finds the
lease lost (the directory expired it, or a newer epoch exists), the directory
has already aborted this worker's unpublished transactions; the worker drops
its own unpublished state (`on_lease_lost`) and registers again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

import grpc

from services.rpc.pd.v1 import common_pb2, directory_pb2, directory_pb2_grpc

log = logging.getLogger(__name__)


class Membership:
    """Keeps one worker registered; `epoch` is current after `start`."""

    def __init__(self, directory_address: str, worker_id: str, role: int, grpc_address: str,
                 data_plane_address: str, abi_digest: str, capacity: common_pb2.WorkerCapacity,
                 load_fn: Callable[[], common_pb2.LoadReport],
                 on_lease_lost: Callable[[], Awaitable[None]] | None = None,
                 rpc_timeout_s: float = 2.0):
        self.channel = grpc.aio.insecure_channel(directory_address)
        self.stub = directory_pb2_grpc.DirectoryStub(self.channel)
        self.request = directory_pb2.RegisterWorkerRequest(
            worker_id=worker_id, role=role, grpc_address=grpc_address,
            data_plane_address=data_plane_address, cache_abi_digest=abi_digest, capacity=capacity)
        self.worker_id = worker_id
        self.load_fn = load_fn
        self.on_lease_lost = on_lease_lost
        self.timeout_s = rpc_timeout_s
        self.epoch = 0
        self.lease_ttl_s = 5.0
        self._task: asyncio.Task | None = None

    async def register(self) -> int:
        """Register (new epoch) and return the epoch."""
        resp = await self.stub.RegisterWorker(self.request, timeout=self.timeout_s)
        self.epoch = resp.epoch
        self.lease_ttl_s = max(resp.lease_ttl_ms / 1000.0, 0.3)
        log.info("registered %s epoch %d lease %.1fs", self.worker_id, self.epoch, self.lease_ttl_s)
        return self.epoch

    async def start(self, attempts: int = 50) -> None:
        """Register (retrying while the directory comes up) and start heartbeats."""
        for i in range(attempts):
            try:
                await self.register()
                break
            except grpc.aio.AioRpcError as e:
                if i == attempts - 1:
                    raise
                log.warning("directory not ready (%s); retrying", e.code().name)
                await asyncio.sleep(0.2)
        self._task = asyncio.create_task(self._beat(), name="heartbeat")

    async def heartbeat_now(self) -> None:
        """Send one heartbeat (load report) right away."""
        resp = await self.stub.Heartbeat(directory_pb2.HeartbeatRequest(
            worker_id=self.worker_id, epoch=self.epoch, load=self.load_fn()), timeout=self.timeout_s)
        if resp.status != directory_pb2.LEASE_STATUS_OK:
            log.warning("lease of %s epoch %d lost; re-registering", self.worker_id, self.epoch)
            if self.on_lease_lost is not None:
                await self.on_lease_lost()
            await self.register()

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_s / 3)
            try:
                await self.heartbeat_now()
            except grpc.aio.AioRpcError as e:
                log.warning("heartbeat failed: %s %s", e.code().name, e.details())
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep beating
                log.exception("heartbeat error")

    async def stop(self) -> None:
        """Stop heartbeating (the lease then expires) and close the channel."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        await self.channel.close()
