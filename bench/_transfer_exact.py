"""The `ucxx-python-exact` path of bench/transfer.py: the floor of an *exact* hand-off.

What any hand-off that checks every byte pays at least from Python, for the geometry
under test, on the same ucxx runtime and endpoint kind as pdserve-ucx:

  sender    each chunk's xxh3-64 over its views (pdserve's checksum), the chunks up to
            ucx/sender.py EAGER_CHUNK_BYTES packed into one buffer per EAGER_BATCH_BYTES
            (one copy, as pdserve packs them), a larger chunk's K and V runs sent as they
            are (zero copy); then every checksum in one message
  receiver  every receive posted beforehand (a packed run into a staging buffer, a large
            chunk's runs straight into its views: no header to wait for); once all
            landed, the staging copied into the views, each chunk hashed and compared,
            then a 1-byte ack ('x' on a mismatch)

timed from the first checksum to the ack. With `commit` (the `ucxx-python-commit` path) the
last message is a COMMIT as pdserve encodes it (tcp/wire.py encode_commit: the manifest's
rows, JSON) instead of the bare checksums; the receiver decodes it and checks each listed
chunk against what landed before it acks. pdserve-ucx does all of this plus its
protocol (headers, destinations resolved per chunk, credits, VISIBLE, the COMMIT's
manifest and the verdict): its time over this path's is the protocol's cost, and this
path's time over raw TCP's is what exactness costs here at the least.
"""

from __future__ import annotations

import asyncio
import base64
import time

import orjson

from runtime.transfer import Chunk, TransferCommit, checksum
from runtime.transfer.common import scatter
from runtime.transfer.tcp.wire import decode_commit, encode_commit
from runtime.transfer.ucx.sender import EAGER_BATCH_BYTES, EAGER_CHUNK_BYTES

EXACT_DATA_TAG, EXACT_ACK_TAG = 0xD << 60, 0xC << 60  # tag kinds pdserve's wire does not use
SUM_CHARS = 16  # xxh3-64 hex digest
COMMIT_BUFFER_BYTES = 64 << 10  # the commit variant's COMMIT, as pdserve's wire caps an inline body
ACK_TIMEOUT_S = 60.0


def messages(plan, views_of) -> list[tuple[bool, list[tuple[object, list[memoryview]]]]]:
    """pdserve's packing of the plan: (packed, [(chunk key, its views)]) per message, in order."""
    out, run, run_bytes = [], [], 0
    for key in plan:
        views = views_of(key)
        nbytes = sum(v.nbytes for v in views)
        if run and (nbytes > EAGER_CHUNK_BYTES or run_bytes + nbytes > EAGER_BATCH_BYTES):
            out.append((True, run))
            run, run_bytes = [], 0
        if nbytes > EAGER_CHUNK_BYTES:
            out.append((False, [(key, views)]))
        else:
            run.append((key, views))
            run_bytes += nbytes
    if run:
        out.append((True, run))
    return out


def _manifest_matches(buf: bytearray, got: dict, chunks: int) -> bool:
    """The COMMIT in `buf` (4-byte length, then JSON) lists `chunks` chunks, each as it landed."""
    n = int.from_bytes(buf[:4], "big")
    manifest = decode_commit(orjson.loads(bytes(buf[4:4 + n]))).chunks
    return len(manifest) == chunks and all(got.get(c.key) == c.checksum for c in manifest)


def _tag(kind: int, i: int, piece: int) -> int:
    return kind + (i << 24) + piece


class ExactFloor:
    """Mixed into bench/_transfer_peers.Peer (its kv, geometry, pending, views_of, digest)."""

    async def exact_expect(self, i: int, sender: str, commit: bool = False) -> None:
        """Zero the cache, post every receive of the exact floor's transfer i; the ack follows
        the check (all outside the timed window but the check and the ack)."""
        from runtime.transfer.ucx.runtime import runtime
        rt = runtime()
        self.kv.zero_()
        ep = await rt.endpoint(base64.b64decode(sender))
        plan = self.geometry.plan()
        msgs = messages(plan, self.views_of)
        sums, got = bytearray(COMMIT_BUFFER_BYTES if commit else SUM_CHARS * len(plan)), {}
        posted, piece = [rt.post_recv(sums, _tag(EXACT_DATA_TAG, i, 0))], 1
        for packed, chunks in msgs:  # each message checked as soon as it landed (as pdserve does)
            views = [v for _, vs in chunks for v in vs]
            staging = bytearray(sum(v.nbytes for v in views)) if packed else None
            mine = [rt.post_recv(v, _tag(EXACT_DATA_TAG, i, piece + k))
                    for k, v in enumerate([staging] if packed else views)]
            piece += len(mine)
            landed = asyncio.gather(*mine)
            landed.add_done_callback(lambda f, chunks=chunks, staging=staging, views=views:
                                     f.exception() or self._exact_check(chunks, staging, views, got))
            posted.append(landed)

        def ack(f: asyncio.Future) -> None:  # 'x' for a failed receive too: the sender must not wait on
            if commit:
                ok = f.exception() is None and _manifest_matches(sums, got, len(plan))
            else:
                ok = f.exception() is None and "".join(got.get(key, "-") for key in plan).encode() == sums
            rt.post_send(ep, bytearray(b"k" if ok else b"x"), _tag(EXACT_ACK_TAG, i, 0))
        done = asyncio.gather(*posted)
        done.add_done_callback(ack)
        self.pending[f"exact-{i}"] = {"done": done}

    @staticmethod
    def _exact_check(chunks: list, staging: bytearray | None, views: list[memoryview], got: dict) -> None:
        """A landed message: its staging copied into its views, each of its chunks hashed."""
        if staging is not None:
            scatter(staging, views)
        for key, vs in chunks:
            got[key] = checksum(vs)

    async def exact_landed(self, i: int, timeout_s: float = 60.0) -> str:
        rec = self.pending.pop(f"exact-{i}")
        async with asyncio.timeout(timeout_s):
            await rec["done"]
        return await self.digest()

    async def exact_send(self, dest: str, i: int, commit: bool = False) -> dict:
        """Hash, pack and send as pdserve would (no protocol); timed to the ack, which must say
        the checksums matched."""
        from runtime.transfer.ucx.runtime import runtime
        rt = runtime()
        ep = await rt.endpoint(base64.b64decode(dest))
        ack = bytearray(1)
        acked = rt.post_recv(ack, _tag(EXACT_ACK_TAG, i, 0))
        t0 = time.perf_counter()
        plan, sent, sums, listed, piece = self.geometry.plan(), [], [], [], 1
        for packed, chunks in messages(plan, self.views_of):
            sums += [checksum(vs) for _, vs in chunks]
            listed += chunks
            views = [v for _, vs in chunks for v in vs]
            for v in [bytearray().join(views)] if packed else views:
                sent.append(rt.post_send(ep, v, _tag(EXACT_DATA_TAG, i, piece)))
                piece += 1
        if commit:
            chunks = tuple(Chunk(key, sum(v.nbytes for v in vs), c) for (key, vs), c in zip(listed, sums))
            body = orjson.dumps(encode_commit(TransferCommit(f"exact-{i}", "bench", 1, "bench-abi", chunks, "-", 0)))
            sent.append(rt.post_send(ep, bytearray(len(body).to_bytes(4, "big") + body), _tag(EXACT_DATA_TAG, i, 0)))
        else:
            sent.append(rt.post_send(ep, bytearray("".join(sums).encode()), _tag(EXACT_DATA_TAG, i, 0)))
        async with asyncio.timeout(ACK_TIMEOUT_S):
            await acked
        elapsed_s = time.perf_counter() - t0
        await asyncio.gather(*sent)
        if ack != b"k":
            raise RuntimeError(f"exact floor {i}: the receiver's checksums differ, or a receive failed")
        return {"elapsed_s": elapsed_s}
