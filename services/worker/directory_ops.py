"""The transaction calls a worker makes on the directory (thin, async)."""

from __future__ import annotations

from typing import Callable

import grpc

from services.rpc.pd.v1 import directory_pb2, directory_pb2_grpc

APPLIED = directory_pb2.TXN_OUTCOME_APPLIED
DUPLICATE = directory_pb2.TXN_OUTCOME_DUPLICATE


class DirectoryUnreachable(RuntimeError):
    """The directory did not answer (treated as: do not publish)."""


class TxnOps:
    """begin / validated / publish / abort / release for one worker identity."""

    def __init__(self, channel: grpc.aio.Channel, worker_id: str, timeout_s: float,
                 epoch_fn: Callable[[], int] = lambda: 0):
        self.stub = directory_pb2_grpc.DirectoryStub(channel)
        self.worker_id = worker_id
        self.timeout_s = timeout_s
        self.epoch_fn = epoch_fn
        """This worker's current epoch (it changes when the worker re-registers)."""

    def _req(self, request_id: str, transfer_id: str, generation: int, reason: str = "",
             kv_digest: str = "") -> directory_pb2.TxnTransitionRequest:
        return directory_pb2.TxnTransitionRequest(
            request_id=request_id, transfer_id=transfer_id, generation=generation,
            worker_id=self.worker_id, worker_epoch=self.epoch_fn(), reason=reason, kv_digest=kv_digest)

    async def _call(self, method, req) -> directory_pb2.TxnResponse:
        try:
            return await method(req, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            raise DirectoryUnreachable(f"directory: {e.code().name} {e.details()}") from e

    async def begin(self, request_id: str, transfer_id: str, generation: int):
        """RESERVED -> TRANSFERRING."""
        return await self._call(self.stub.Begin, self._req(request_id, transfer_id, generation))

    async def validated(self, request_id: str, transfer_id: str, generation: int, kv_digest: str):
        """TRANSFERRING -> VALIDATED."""
        return await self._call(self.stub.Validated,
                                self._req(request_id, transfer_id, generation, kv_digest=kv_digest))

    async def publish(self, request_id: str, transfer_id: str, generation: int, kv_digest: str):
        """VALIDATED -> PUBLISHED, compare-and-set on the request's current generation."""
        req = directory_pb2.TxnPublishRequest(
            request_id=request_id, transfer_id=transfer_id, generation=generation,
            destination_worker_id=self.worker_id, destination_epoch=self.epoch_fn(),
            kv_digest=kv_digest)
        return await self._call(self.stub.Publish, req)

    async def abort(self, request_id: str, transfer_id: str, generation: int, reason: str):
        """Any unpublished state -> ABORTED (idempotent). Never raises."""
        try:
            return await self._call(self.stub.Abort,
                                    self._req(request_id, transfer_id, generation, reason))
        except DirectoryUnreachable:
            return None  # the lease/TTL reaper aborts it later

    async def release(self, request_id: str, transfer_id: str, generation: int):
        """PUBLISHED -> RELEASED. Never raises."""
        try:
            return await self._call(self.stub.Release, self._req(request_id, transfer_id, generation))
        except DirectoryUnreachable:
            return None
