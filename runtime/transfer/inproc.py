"""In-process backend for unit tests: a sender writes straight into a receiver's views."""

from __future__ import annotations

from collections.abc import Sequence

from .base import (
    UNAUTHORIZED,
    Chunk,
    ChunkArrived,
    KVReceiver,
    KVSender,
    TransferCommit,
    TransferError,
    Verdict,
    chunk_checksum,
    trusts,
)

_RECEIVERS: dict[str, InprocReceiver] = {}


class InprocReceiver(KVReceiver):
    """Receiver registered under `inproc://NAME` in this process."""

    def __init__(self, name: str):
        super().__init__()
        self._address = f"inproc://{name}"

    @property
    def address(self) -> str:
        return self._address

    async def start(self) -> None:
        _RECEIVERS[self._address] = self

    async def stop(self) -> None:
        _RECEIVERS.pop(self._address, None)
        for tid in list(self.pending):
            self._fail(tid, "receiver stopped")

    def _write(self, transfer_id: str, chunk: Chunk, buffers: Sequence[memoryview], sender: object) -> None:
        exp = self.pending.get(transfer_id)
        if exp is None:
            raise TransferError(f"{self._address}: transfer {transfer_id} not expected")
        if not trusts(exp, sender):
            raise TransferError(f"{self._address}: transfer {transfer_id}: {UNAUTHORIZED}")
        try:
            dest = exp.resolve(chunk.key)
        except KeyError as e:
            self._fail(transfer_id, f"unexpected chunk {chunk.key}: {e}")
            raise TransferError(f"chunk {chunk.key} rejected") from e
        src = b"".join(bytes(b) for b in buffers)
        if len(src) != sum(d.nbytes for d in dest):
            self._fail(transfer_id, f"chunk {chunk.key} is {len(src)} bytes, expected "
                                    f"{sum(d.nbytes for d in dest)}")
            raise TransferError("chunk size mismatch")
        off = 0
        for d in dest:
            d.cast("B")[:] = src[off:off + d.nbytes]
            off += d.nbytes
        arrived = ChunkArrived(transfer_id, chunk.key, len(src), chunk_checksum(exp.tkey, chunk.key, dest))
        exp.received[chunk.key] = arrived
        exp.on_event(arrived)


class InprocSender(KVSender):
    """Sender that finds receivers in this process's registry."""

    def _receiver(self, dest: str) -> InprocReceiver:
        try:
            return _RECEIVERS[dest]
        except KeyError:
            raise TransferError(f"no receiver at {dest}") from None

    async def send(self, dest: str, transfer_id: str, chunk: Chunk,
                   buffers: Sequence[memoryview]) -> None:
        self._receiver(dest)._write(transfer_id, chunk, buffers, self)

    async def present(self, dest: str, transfer_id: str, credential: dict | None, key: bytes = b"",
                      confirm: bool = False) -> None:
        why = await self._receiver(dest).admit(transfer_id, credential or {}, None, self)
        if why:
            raise TransferError(f"transfer {transfer_id} to {dest}: {why}")

    async def commit(self, dest: str, commit: TransferCommit) -> Verdict:
        recv = self._receiver(dest)
        exp = recv.pending.get(commit.transfer_id)
        if exp is None:
            return Verdict(False, f"transfer {commit.transfer_id} not expected")
        recv.pending.pop(commit.transfer_id, None)
        verdict = await exp.on_commit(commit)
        recv._reopen(exp, commit, verdict)
        return verdict

    async def abort(self, dest: str, transfer_id: str, reason: str) -> None:
        recv = _RECEIVERS.get(dest)
        if recv is not None:
            recv._fail(transfer_id, f"aborted by sender: {reason}")
