"""runtime/transfer/faults.py: the fault suite's data-plane faults as a decorator of
a sender (here over a recording sender; the fault suite runs it over tcp and ucx)."""

from __future__ import annotations

import asyncio
import time

from runtime.transfer.base import Chunk, ChunkKey, KVSender, TransferCommit, Verdict
from runtime.transfer.faults import FaultySender, SenderFaults


class Recording(KVSender):
    def __init__(self):
        self.log: list[tuple] = []

    async def send(self, dest, transfer_id, chunk, views):
        self.log.append(("send", transfer_id, chunk.key.layer, chunk.checksum, time.monotonic()))

    async def present(self, dest, transfer_id, credential, key=b"", confirm=False):
        self.log.append(("present", transfer_id, time.monotonic()))

    async def commit(self, dest, commit):
        self.log.append(("commit", commit.transfer_id, time.monotonic()))
        return Verdict(True)

    async def abort(self, dest, transfer_id, reason):
        self.log.append(("abort", transfer_id))

    def figures(self):
        return "inner's"


def chunk(layer: int) -> Chunk:
    return Chunk(ChunkKey(layer, 0, 1), 8, f"{layer:016x}")


def commit(tid: str) -> TransferCommit:
    return TransferCommit(tid, "r", 1, "abi", (), "kv", 7)


def test_off_is_never_any():
    assert not SenderFaults().any and SenderFaults(replay_chunk=0).any


def test_corrupt_and_replay_count_chunks_per_transfer_and_start_again_after_the_commit():
    inner = Recording()
    s = FaultySender(inner, SenderFaults(corrupt_chunk=1, replay_chunk=2))

    async def go():
        for tid in ("a/1", "a/2"):
            for layer in range(3):
                await s.send("d", tid, chunk(layer), None)
            await s.commit("d", commit(tid))

    asyncio.run(go())
    sends = [(e[1], e[2], e[3]) for e in inner.log if e[0] == "send"]
    for tid in ("a/1", "a/2"):
        mine = [(layer, c) for t, layer, c in sends if t == tid]
        corrupted = f"{1 ^ 1:016x}"  # chunk 1's checksum with its low bit flipped
        assert mine == [(0, f"{0:016x}"), (1, corrupted), (2, f"{2:016x}"), (2, f"{2:016x}")]
    assert s.figures() == "inner's"  # everything else is the inner sender's


def test_delays_hold_the_first_chunk_or_a_chunkless_commit_and_every_later_chunk():
    inner = Recording()
    s = FaultySender(inner, SenderFaults(delay_before_send_s=0.2, chunk_delay_s=0.1))

    async def go():
        t0 = time.monotonic()
        await s.send("d", "b/1", chunk(0), None)
        await s.send("d", "b/1", chunk(1), None)
        await s.commit("d", commit("b/1"))
        await s.commit("d", commit("c/1"))  # nothing sent: the commit itself waits
        await s.abort("d", "b/1", "x")
        return t0

    t0 = asyncio.run(go())
    times = [e[-1] - t0 for e in inner.log if e[0] in ("send", "commit")]
    assert times[0] >= 0.2 and times[1] - times[0] >= 0.1
    assert times[2] - times[1] < 0.1  # a commit after chunks does not wait
    assert times[3] - times[2] >= 0.2
    assert inner.log[-1] == ("abort", "b/1")
