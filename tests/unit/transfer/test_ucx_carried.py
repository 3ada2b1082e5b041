"""The UCX receiver's rules for a COMMIT carried in a batch's CHUNK header, on a stand-in
runtime (no UCX): the real backend between processes is tests/integration/test_transfer.py."""

from __future__ import annotations

import asyncio

from runtime.transfer import Chunk, ChunkKey, Expectation, Failed, TransferCommit, Verdict, chunk_checksum
from runtime.transfer.common import pack
from runtime.transfer.keys import new_key
from runtime.transfer.tcp.wire import encode_commit
from runtime.transfer.ucx import wire
from runtime.transfer.ucx.receiver import UcxReceiver

SENDER = 7
BLOCK = 64


class StandInRuntime:
    """Receives complete when the test delivers; replies are recorded as (kind, body)."""

    def __init__(self):
        self.recvs: list[tuple[asyncio.Future, object]] = []
        self.replies: list[tuple[int, dict]] = []

    def expect_tags(self, kind, bits, count=1):
        pass

    def post_recv(self, buffer, tag):
        fut = asyncio.get_running_loop().create_future()
        self.recvs.append((fut, buffer))
        return fut

    def post_send(self, ep, buffer, tag):
        msg = wire.decode(memoryview(buffer))
        self.replies.append((msg.kind, msg.body()))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    def deliver(self, data: bytes) -> None:
        for fut, buffer in self.recvs:  # a swallowing 1-byte receive gets the data's first byte
            view = memoryview(buffer)
            view[:] = data[:view.nbytes]
            fut.set_result(None)
        self.recvs.clear()


def setup(tid: str = "t/1"):
    """A receiver expecting `tid` (4 one-block chunks into a bytearray), and what the sender
    would send: the chunks' bytes, the batch header's fields and the commit."""
    rt, cache, events, decided = StandInRuntime(), bytearray(4 * BLOCK), [], []
    r = UcxReceiver()
    r._rt = rt

    async def on_commit(commit):
        decided.append(commit)
        return Verdict(True)
    keys = [ChunkKey(layer, 0, 1) for layer in range(4)]
    views = {k: [memoryview(cache)[k.layer * BLOCK:(k.layer + 1) * BLOCK]] for k in keys}
    exp = Expectation(tid, lambda k: views[k], events.append, on_commit, key=new_key())
    r.expect(exp)
    r._in.live[tid].replies[SENDER] = object()  # as its AUTH said (the stand-in runtime posts anywhere)
    r._in.live[tid].admitted = SENDER
    data = bytes(range(256)) * (4 * BLOCK // 256)
    items = [(Chunk(k, BLOCK, chunk_checksum(exp.tkey, k, [memoryview(data)[k.layer * BLOCK:(k.layer + 1) * BLOCK]])),
              [memoryview(data)[k.layer * BLOCK:(k.layer + 1) * BLOCK]]) for k in keys]
    batch, buf = [list(c.row) for c, _ in items], pack([v for _, vs in items for v in vs])
    commit = TransferCommit(tid, "t", 1, "abi", tuple(c for c, _ in items), "digest", 5)
    head = {"serial": 0, "sizes": [len(buf)], "tag": wire.tag(wire.DATA, exp.tkey.tag_bits, 1), "batch": batch}
    return r, rt, cache, events, decided, bytes(buf), head, commit


def test_a_carried_commit_is_decided_once_its_batch_landed():
    async def go():
        r, rt, cache, events, decided, data, head, commit = setup()
        r._on_chunk("t/1", {**head, "commit": encode_commit(commit)})
        await asyncio.sleep(0)
        assert decided == [] and "t/1" in r.pending  # held: its batch has not landed
        rt.deliver(data)
        for _ in range(5):
            await asyncio.sleep(0)
        assert decided == [commit] and bytes(cache) == data and r.stats["carried_commits"] == 1
        assert (wire.VERDICT, {"published": True, "reason": ""}) in rt.replies
        assert not [e for e in events if isinstance(e, Failed)]
    asyncio.run(go())


def test_a_carried_commit_naming_another_transfer_fails_it_and_writes_nothing():
    async def go():
        r, rt, cache, events, decided, data, head, commit = setup()
        other = TransferCommit("t/2", "t", 1, "abi", commit.chunks, "digest", 5)
        r._on_chunk("t/1", {**head, "commit": encode_commit(other)})
        rt.deliver(data)  # the swallowed pieces: 1-byte receives, never the cache
        for _ in range(3):
            await asyncio.sleep(0)
        failed = [e for e in events if isinstance(e, Failed)]
        assert failed and "it names transfer t/2" in failed[0].reason, events
        assert "t/1" not in r.pending and decided == [] and bytes(cache) == bytes(len(cache))
    asyncio.run(go())


def test_a_commit_after_a_carried_one_is_refused_as_a_second_commit():
    async def go():
        r, rt, cache, events, decided, data, head, commit = setup()
        r._on_chunk("t/1", {**head, "commit": encode_commit(commit)})
        assert r._on_commit("t/1", encode_commit(commit)) is None
        failed = [e for e in events if isinstance(e, Failed)]
        assert failed and "a second COMMIT" in failed[0].reason, events
        rt.deliver(data)
        for _ in range(3):
            await asyncio.sleep(0)
        assert decided == [] and bytes(cache) == bytes(len(cache))  # ended before landing: not copied
    asyncio.run(go())


def test_a_malformed_carried_commit_fails_the_transfer():
    async def go():
        r, rt, cache, events, decided, data, head, _ = setup()
        r._on_chunk("t/1", {**head, "commit": {"transfer_id": "t/1"}})
        failed = [e for e in events if isinstance(e, Failed)]
        assert failed and "malformed commit" in failed[0].reason, events
        assert (wire.ERROR, {"reason": failed[0].reason}) in rt.replies
    asyncio.run(go())


def test_a_carried_commit_whose_manifest_is_not_its_batch_is_decided_on_its_own_manifest():
    """The batch's decoded chunks stand in for the COMMIT's only when its rows are the batch's."""
    async def go():
        r, rt, cache, events, decided, data, head, commit = setup()
        forged = Chunk(commit.chunks[0].key, BLOCK, "0" * 16)  # another checksum for chunk 0
        other = TransferCommit("t/1", "t", 1, "abi", (forged, *commit.chunks[1:]), "digest", 5)
        r._on_chunk("t/1", {**head, "commit": encode_commit(other)})
        rt.deliver(data)
        for _ in range(5):
            await asyncio.sleep(0)
        assert decided == [other] and decided[0].chunks[0].checksum == "0" * 16
    asyncio.run(go())


def test_a_batch_row_with_a_number_as_text_is_refused_and_nothing_is_written():
    async def go():
        r, rt, cache, events, decided, data, head, commit = setup()
        batch = [list(row) for row in head["batch"]]
        batch[1][0] = str(batch[1][0])  # "1": int() would have taken it
        r._on_chunk("t/1", {**head, "batch": batch, "commit": encode_commit(commit)})
        rt.deliver(data)  # the swallowed piece: a 1-byte receive, never the cache
        for _ in range(3):
            await asyncio.sleep(0)
        failed = [e for e in events if isinstance(e, Failed)]
        assert failed and "malformed CHUNK" in failed[0].reason and "[layer, start, count" in failed[0].reason
        assert "t/1" not in r.pending and decided == [] and bytes(cache) == bytes(len(cache))
    asyncio.run(go())
