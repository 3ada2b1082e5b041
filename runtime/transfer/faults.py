"""Data-plane faults for the fault suite, as a decorator of any `KVSender`.

`FaultySender` wraps the sender a worker built when a `PD_FAULT_*` data-plane knob
is set (runtime/worker/process.build_sender), so the prefill worker's own code
has no fault branches. Per transfer (counted by chunk):

* ``delay_before_send_s``: the first chunk (or a commit with no chunk) waits this
  long: a window between reserve and publish to kill a worker in;
* ``chunk_delay_s``: every chunk after the first waits this long (a hand-off that
  stays mid-stream for a while);
* ``corrupt_chunk``: chunk i travels with a wrong checksum (the destination must
  refuse the commit: checksum mismatch);
* ``replay_chunk``: chunk i is sent twice (the destination must refuse: duplicate).

Off (every knob at its default) it is never built: production senders are bare.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter

from .base import Chunk, KVSender, TransferCommit, Verdict


@dataclasses.dataclass(frozen=True)
class SenderFaults:
    delay_before_send_s: float = 0.0
    chunk_delay_s: float = 0.0
    corrupt_chunk: int = -1
    replay_chunk: int = -1

    @property
    def any(self) -> bool:
        return self != SenderFaults()


class FaultySender(KVSender):
    """`inner` with `faults` injected (see the module docstring); everything else,
    figures and credit windows included, is the inner sender's."""

    def __init__(self, inner: KVSender, faults: SenderFaults):
        self._inner = inner
        self._faults = faults
        self._sent: Counter[str] = Counter()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)  # metrics, credit_windows, paths...

    async def start(self) -> None:
        await self._inner.start()

    async def send(self, dest: str, transfer_id: str, chunk: Chunk, views) -> None:
        f, i = self._faults, self._sent[transfer_id]
        if i == 0 and f.delay_before_send_s:
            await asyncio.sleep(f.delay_before_send_s)
        if i and f.chunk_delay_s:
            await asyncio.sleep(f.chunk_delay_s)
        if i == f.corrupt_chunk:
            chunk = dataclasses.replace(chunk, checksum=f"{int(chunk.checksum, 16) ^ 1:016x}")
        self._sent[transfer_id] += 1
        await self._inner.send(dest, transfer_id, chunk, views)
        if i == f.replay_chunk:
            await self._inner.send(dest, transfer_id, chunk, views)

    async def present(self, dest: str, transfer_id: str, credential: dict | None, key: bytes = b"",
                      confirm: bool = False) -> None:
        await self._inner.present(dest, transfer_id, credential, key, confirm)

    async def commit(self, dest: str, commit: TransferCommit) -> Verdict:
        if not self._sent.pop(commit.transfer_id, 0) and self._faults.delay_before_send_s:
            await asyncio.sleep(self._faults.delay_before_send_s)
        return await self._inner.commit(dest, commit)

    async def abort(self, dest: str, transfer_id: str, reason: str) -> None:
        self._sent.pop(transfer_id, None)
        await self._inner.abort(dest, transfer_id, reason)

    async def close(self) -> None:
        await self._inner.close()
