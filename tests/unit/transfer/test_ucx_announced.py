"""The UCX receiver's rules for an announced batch (its header's checksums "", sent before
the chunks were hashed: the COMMIT brings them), on a stand-in runtime (no UCX); the real
backend between processes is tests/integration/test_transfer.py."""

from __future__ import annotations

import asyncio
import dataclasses

from runtime.transfer import ChunkArrived, Failed, TransferCommit
from runtime.transfer.tcp.wire import encode_commit
from runtime.transfer.ucx import wire
from tests.unit.transfer.test_ucx_carried import BLOCK, setup


def announced(head: dict) -> dict:
    return {**head, "batch": [[*row[:4], ""] for row in head["batch"]]}


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def landed_unchecked():
    """`setup()`'s receiver after an announced batch's header and its data, no COMMIT yet."""
    r, rt, cache, events, decided, data, head, commit = parts = setup()
    r._on_chunk("t/1", announced(head))
    rt.deliver(data)
    await turns()
    return parts


def test_chunks_landed_before_their_commit_are_checked_against_it():
    async def go():
        r, rt, cache, events, decided, data, head, commit = await landed_unchecked()
        # Landed and copied, but nothing counts as arrived and nothing is VISIBLE: unchecked.
        assert bytes(cache) == data and not [e for e in events if isinstance(e, ChunkArrived)]
        assert not [k for k, _ in rt.replies if k == wire.VISIBLE] and decided == []
        assert r._on_commit("t/1", encode_commit(commit)) is None  # held, then checked at once
        await turns()
        assert decided == [commit] and (wire.VERDICT, {"published": True, "reason": ""}) in rt.replies
        arrived = {e.key: e.checksum for e in events if isinstance(e, ChunkArrived)}
        assert arrived == {c.key: c.checksum for c in commit.chunks}  # the checksums it computed, equal
        assert not r._unverified and not r._held
    asyncio.run(go())


def test_a_commit_ahead_of_the_announced_data_is_held_until_it_lands():
    async def go():
        r, rt, cache, events, decided, data, head, commit = setup()
        r._on_chunk("t/1", announced(head))
        assert r._on_commit("t/1", encode_commit(commit)) is None
        await turns()
        assert decided == [] and "t/1" in r._held
        rt.deliver(data)
        await turns()
        assert decided == [commit] and bytes(cache) == data
    asyncio.run(go())


def test_an_announced_chunk_whose_commit_checksum_differs_fails_and_is_never_arrived():
    async def go():
        r, rt, cache, events, decided, data, head, commit = await landed_unchecked()
        wrong = dataclasses.replace(commit.chunks[2], checksum="0" * 16)
        forged = TransferCommit("t/1", "t", 1, "abi", (*commit.chunks[:2], wrong, commit.chunks[3]), "digest", 5)
        r._on_commit("t/1", encode_commit(forged))
        await turns()
        failed = [e for e in events if isinstance(e, Failed)]
        assert failed and f"checksum mismatch in chunk {wrong.key}: sender {'0' * 16}" in failed[0].reason
        assert decided == [] and "t/1" not in r.pending and not r._unverified
        assert not [e for e in events if isinstance(e, ChunkArrived)]  # none of the batch counts
        assert (wire.ERROR, {"reason": failed[0].reason}) in rt.replies
    asyncio.run(go())


def test_an_announced_chunk_the_commit_does_not_list_fails_the_transfer():
    async def go():
        r, rt, cache, events, decided, data, head, commit = setup()
        r._on_chunk("t/1", announced(head))
        short = TransferCommit("t/1", "t", 1, "abi", commit.chunks[1:], "digest", 5)
        r._on_commit("t/1", encode_commit(short))
        rt.deliver(data)
        await turns()
        failed = [e for e in events if isinstance(e, Failed)]
        assert failed and "sender none in the COMMIT" in failed[0].reason, events
        assert decided == []
    asyncio.run(go())


def test_a_forgotten_transfer_drops_its_unchecked_chunks():
    async def go():
        r, rt, cache, events, decided, data, head, commit = await landed_unchecked()
        assert r._unverified
        r.forget("t/1")
        assert not r._unverified and "t/1" not in r.pending
    asyncio.run(go())


def test_rows_of_one_batch_may_mix_announced_and_hashed_chunks():
    """A hashed row is checked on landing as before; the batch still waits for the COMMIT."""
    async def go():
        r, rt, cache, events, decided, data, head, commit = setup()
        rows = announced(head)["batch"]
        rows[0] = list(head["batch"][0])
        r._on_chunk("t/1", {**head, "batch": rows})
        rt.deliver(data)
        await turns()
        assert r._unverified and decided == []
        r._on_commit("t/1", encode_commit(commit))
        await turns()
        assert decided == [commit] and len(cache) == 4 * BLOCK
    asyncio.run(go())


def test_the_fence_drains_a_staging_receive_at_once_and_waits_for_one_into_the_cache():
    """A receive into a staging buffer holds no cache memory: a transfer ended before its data
    came (an announced batch whose sender was cancelled) gives its blocks back at once."""
    from runtime.transfer.ucx.runtime import fence_receives

    class Drains:
        def __init__(self, futs):
            self.futs, self.drained = futs, []

        async def drain(self, tag):
            self.drained.append((tag, asyncio.get_running_loop().time()))
            self.futs[tag].set_result(None)

    async def go():
        loop = asyncio.get_running_loop()
        futs = {1: loop.create_future(), 2: loop.create_future()}
        rt, t0 = Drains(futs), loop.time()
        assert await fence_receives(rt, [(1, futs[1], True)], 0.5, 1.0, "t") == 1
        assert rt.drained[0][1] - t0 < 0.1  # no wait for data that no cache byte depends on
        assert await fence_receives(rt, [(2, futs[2], False)], 0.3, 1.0, "t") == 1
        assert rt.drained[1][1] - t0 >= 0.3  # into the cache: its data may still land first
        done = loop.create_future()
        done.set_result(None)
        assert await fence_receives(rt, [(3, done, True), (4, done, False)], 0.3, 1.0, "t") == 0
    asyncio.run(go())
