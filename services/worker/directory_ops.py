"""The transaction calls a worker makes on the directory, bound to its identity.

A thin layer over `kv_directory.client.DirectoryClient`: it fills in this
worker's id and current epoch (which changes when the worker re-registers) and
makes the clean-up calls (`abort`, `release`) best effort. Errors are the
client's: `DirectoryUnavailable` when the directory cannot answer.
"""

from __future__ import annotations

from typing import Callable

from kv_directory.client import DirectoryClient, TxnReply
from kv_directory.store import DirectoryUnavailable

__all__ = ["DirectoryUnavailable", "TxnOps"]


class TxnOps:
    """begin / validated / publish / abort / release for one worker identity."""

    def __init__(self, client: DirectoryClient, worker_id: str,
                 epoch_fn: Callable[[], int] = lambda: 0):
        self.client = client
        self.worker_id = worker_id
        self.epoch_fn = epoch_fn
        """This worker's current epoch (it changes when the worker re-registers)."""

    async def begin(self, request_id: str, transfer_id: str, generation: int) -> TxnReply:
        """RESERVED -> TRANSFERRING."""
        return await self.client.begin(request_id, transfer_id, generation, self.worker_id,
                                       self.epoch_fn())

    async def validated(self, request_id: str, transfer_id: str, generation: int,
                        kv_digest: str = "") -> TxnReply:
        """TRANSFERRING -> VALIDATED."""
        return await self.client.validated(request_id, transfer_id, generation, self.worker_id,
                                           self.epoch_fn(), kv_digest)

    async def publish(self, request_id: str, transfer_id: str, generation: int,
                      kv_digest: str = "") -> TxnReply:
        """VALIDATED -> PUBLISHED, compare-and-set on the request's current generation."""
        return await self.client.publish(request_id, transfer_id, generation, self.worker_id,
                                         self.epoch_fn(), kv_digest)

    async def abort(self, request_id: str, transfer_id: str, generation: int,
                    reason: str) -> TxnReply | None:
        """Any unpublished state -> ABORTED (idempotent). Never raises: if the
        directory is down, its lease/TTL reaper aborts the transaction later."""
        try:
            return await self.client.abort(request_id, transfer_id, generation, self.worker_id,
                                           self.epoch_fn(), reason)
        except (DirectoryUnavailable, ValueError):
            return None

    async def release(self, request_id: str, transfer_id: str, generation: int) -> TxnReply | None:
        """PUBLISHED -> RELEASED. Never raises (retention expiry cleans up)."""
        try:
            return await self.client.release(request_id, transfer_id, generation, self.worker_id,
                                             self.epoch_fn())
        except (DirectoryUnavailable, ValueError):
            return None
