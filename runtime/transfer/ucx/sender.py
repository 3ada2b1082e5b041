"""UCX backend, sender side: UcxSender pushes chunks into a UcxReceiver's posted buffers.

Per message (the chunk ledger: docs/design.md, Contracts): acquire credit -> CHUNK header (one chunk, or a
batch of small ones; the sender's view sizes; the first data tag), then the data: a large
chunk's K and V runs zero copy from the cache (UCX rendezvous: the receiver reads them
straight into its posted views, cma on one host), a batch packed into one buffer
<- VISIBLE (in the destination views, checksum verified) -> credit released (none for the
message whose landing lets the COMMIT through: its credit returns with the VERDICT).

A transfer opens with `present` (exchange.py): its AUTH tells the receiver where to
reply, and every message of the transfer, either way, is authenticated under the
transfer's key (keys.py); a chunk's data goes on tags only the key's holders can name.

`send` returns once the chunk is issued (credit held, CHUNK sent): the caller's
buffers must stay valid until `commit` or `abort` returns. `commit` sends COMMIT
right behind the last chunk, or in its header (`send_many(hold_last=True)`: the last
batch waits for it); the receiver holds it until every chunk it accepted landed. It
returns the VERDICT: one round trip after the last chunk, not two.
Every wait on the peer is bounded by io_timeout_s; on a failure the transfer
fails (TransferError on its next send/commit) and the caller calls `abort`.

Credit rule on failure: a failed chunk's credit returns only after its piece
sends are fenced — completed, or (peer unresponsive for fence_timeout_s) its
endpoint aborted and dropped, after which UCX delivers nothing more for them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterable, Sequence

from ..base import Chunk, ChunkKey, KVSender, TransferCommit, TransferError, Verdict, token_follows
from ..common import chunk_buffers, pack
from ..credits import CreditWindow
from ..tcp.wire import encode_commit
from . import wire
from .credits import SenderCredits
from .exchange import SenderExchange
from .inbound import Rejections
from .mailbox import Mailbox
from .outgoing import Keys, OutChunk, Outgoing, Peer, announceable, connect, sender_metrics, wait_progress
from .runtime import UcxRuntime, runtime, runtime_samples

log = logging.getLogger(f"{__package__}.ucx")

EAGER_CHUNK_BYTES = 256 << 10
"""`send_many`: chunks up to this size leave together, copied into one message (a chunk's
fixed cost — header, receives, VISIBLE, credit — is paid once per batch)."""
EAGER_BATCH_BYTES = 2 << 20  # at most this much in one batch


class UcxSender(SenderExchange, SenderCredits, KVSender):
    """Pushes chunks to UcxReceivers over UCX endpoints made from their worker addresses."""

    def __init__(self, window_bytes: int = 64 << 20, io_timeout_s: float = 30.0,
                 fence_timeout_s: float = 2.0):
        self.window_bytes, self.io_timeout_s = window_bytes, io_timeout_s
        self.fence_timeout_s = fence_timeout_s
        self.nonce = wire.new_nonce()  # names our mailbox (REPLY tag): it routes, it proves nothing
        self._rt: UcxRuntime | None = None
        self._mailbox: Mailbox | None = None
        self._peers: dict[str, Peer] = {}
        self._connecting: dict[str, asyncio.Future] = {}
        self._outs: dict[str, Outgoing] = {}
        self._keys = Keys()  # each presented transfer's key, until its end
        self._seq = itertools.count(time.time_ns())  # our messages' seq (from the clock: a later sender's are larger)
        self.rejected = Rejections()
        self.stats = dict(chunks=0, bytes=0, failed_transfers=0, announced_batches=0)

    # -- KVSender
    async def start(self) -> None:
        self._ensure_runtime()

    def _ensure_runtime(self) -> None:
        if self._rt is None:
            self._rt = runtime()
            self._rt.exporter = self._rt.exporter or self
            self._mailbox = Mailbox(self._rt, wire.tag(wire.REPLY, self.nonce), self._on_reply, "ucx-sender",
                                    on_reject=self.rejected.add)
            self._mailbox.start()

    async def send(self, dest: str, transfer_id: str, chunk: Chunk,
                   buffers: Sequence[memoryview]) -> None:
        await self.send_many(dest, transfer_id, [(chunk, buffers)])

    async def send_many(self, dest: str, transfer_id: str,
                        items: Iterable[tuple[Chunk, Sequence[memoryview]]], hold_last: bool = False,
                        keys: Sequence[tuple[ChunkKey, int]] = ()) -> None:
        """Runs of small chunks (each up to EAGER_CHUNK_BYTES) leave as one batch message
        per EAGER_BATCH_BYTES (or credit window); a larger chunk goes alone, zero copy.
        `hold_last`: a last run of several chunks waits for the COMMIT and carries it; or,
        with `keys` that fit one batch, its header leaves first, announcing them (`_announce`)."""
        peer = await self._peer(dest)
        out = self._out(peer, transfer_id)
        if out.held is not None and not out.failed:  # more chunks: the held batch leaves first, alone
            self._post(out, out.held)
            out.held = None
        limit, run, run_bytes = min(EAGER_BATCH_BYTES, peer.credits.capacity), [], 0
        if out.announced is not None or (hold_last and announceable(keys, limit, EAGER_CHUNK_BYTES)):
            await self._announce(out, keys, items)
            return
        for chunk, buffers in items:
            views = chunk_buffers(chunk, buffers)
            big = chunk.num_bytes > EAGER_CHUNK_BYTES
            if run and (big or run_bytes + chunk.num_bytes > limit):
                run, run_bytes = await self._issue(out, run), 0
            run.append((chunk, views))
            run_bytes += chunk.num_bytes
            if big:
                run, run_bytes = await self._issue(out, run), 0
        if run:
            await self._issue(out, run, hold=hold_last)

    async def announce(self, dest: str, transfer_id: str, keys: Sequence[tuple[ChunkKey, int]]) -> None:
        peer = await self._peer(dest)
        out = self._out(peer, transfer_id)
        if out.announced is None and announceable(keys, min(EAGER_BATCH_BYTES, peer.credits.capacity),
                                                  EAGER_CHUNK_BYTES):
            out.announced = (await self._head(out, keys), list(keys))

    async def _head(self, out: Outgoing, keys: Sequence[tuple[ChunkKey, int]]) -> OutChunk:
        """An announced batch's header, its rows' checksums "" (the COMMIT brings them), posted."""
        nbytes = sum(n for _, n in keys)
        await self._credit(out, nbytes)
        c = OutChunk(next(out.serials), keys[0][0], nbytes, [], {"batch": [[*k, n, ""] for k, n in keys]}, packed=True)
        out.chunks[c.serial] = c
        self._post(out, c, data=False)
        self.stats["announced_batches"] += 1
        out.raise_if_failed()
        return c

    async def _announce(self, out: Outgoing, keys: Sequence[tuple[ChunkKey, int]],
                        items: Iterable[tuple[Chunk, Sequence[memoryview]]]) -> None:
        """One batch whose header leaves before its chunks are taken (and hashed by the caller),
        or left already (`announce`); then its data, packed. An item that is not the one
        announced fails the transfer (its receiver waits for data that never comes: the
        caller's abort ends it there)."""
        c, keys = out.announced or (None, keys)
        out.announced = None
        if c is None:
            c = await self._head(out, keys)
        nbytes = c.nbytes
        for i, (chunk, buffers) in enumerate(items):
            if i >= len(keys) or (chunk.key, chunk.num_bytes) != tuple(keys[i]):
                self._fail(out, f"chunk {chunk.key} of {chunk.num_bytes} bytes is not the one announced {i}th")
                break
            c.views += chunk_buffers(chunk, buffers)
        if sum(v.nbytes for v in c.views) != nbytes and not out.failed:
            self._fail(out, f"{len(keys)} chunks announced, fewer taken")
        if not out.failed:
            self._post(out, c, header=False)
        out.raise_if_failed()

    async def _issue(self, out: Outgoing, items: list[tuple[Chunk, list[memoryview]]], hold: bool = False) -> list:
        """Send `items` as one message (a batch when several; `hold`: a batch waits in
        `out.held` for the COMMIT, its credit taken); returns a new empty run."""
        chunk, views = items[0]
        nbytes = sum(c.num_bytes for c, _ in items)
        await self._credit(out, nbytes)
        batch = [list(c.row) for c, _ in items] if len(items) > 1 else None
        head = {"batch": batch} if batch else {"bytes": nbytes, "checksum": chunk.checksum, "key": list(chunk.key)}
        c = OutChunk(next(out.serials), chunk.key, nbytes, [v for _, vs in items for v in vs] if batch else views,
                     head, packed=batch is not None)
        out.chunks[c.serial] = c
        if hold and batch:
            out.held = c
        else:
            self._post(out, c)
        out.raise_if_failed()
        return []

    def _post(self, out: Outgoing, c: OutChunk, commit: dict | None = None, header: bool = True,
              data: bool = True) -> None:
        """Post `c`'s header (`commit`: a COMMIT riding in it), then its data; a batch is packed
        in between, while the receiver checks the header (an announced batch: one or the
        other, `header`/`data`). A UCX error fails the transfer."""
        peer, sends = out.peer, []
        pieces = [v for v in c.views if v.nbytes]
        try:
            if header:
                c.tag = out.keyed.tags(wire.DATA, 1 if c.packed else max(1, len(pieces)))
                sizes = [c.nbytes] if c.packed else [v.nbytes for v in pieces]
                body = {"serial": c.serial, "sizes": sizes, "tag": c.tag, **c.head}
                if commit is not None:
                    body["commit"] = commit
                sends = self._post_control(out, wire.CHUNK, body)
            if data:
                if c.packed:
                    pieces = c.views = [pack(pieces)]  # (referenced until sent: `_future` keeps it)
                sends += [self._rt.post_send(peer.ep, v, c.tag + i) for i, v in enumerate(pieces)]
                c.state = "sending"
        except Exception as e:  # noqa: BLE001 - any UCX error
            self._fail(out, f"CHUNK to {wire.peer_name(peer.dest)} failed: {e!r}")
        c.sends += sends
        for f in sends:
            f.add_done_callback(self._failing(out, f"chunk {c.key}"))

    def _failing(self, out: Outgoing, what: str):
        """A send's done-callback: its failure fails the transfer."""
        return lambda f: f.cancelled() or f.exception() is None or self._fail(
            out, f"{what}: send failed: {f.exception()!r}")

    async def commit(self, dest: str, commit: TransferCommit) -> Verdict:
        return await self._verdict(self._post_commit(await self._peer(dest), commit), token_follows(commit))

    def commit_now(self, dest: str, commit: TransferCommit) -> asyncio.Future | None:
        peer = self._peers.get(dest)
        if peer is None or peer.dead or commit.transfer_id not in self._keys:
            return None
        return asyncio.ensure_future(self._verdict(self._post_commit(peer, commit), token_follows(commit)))

    def _post_commit(self, peer: Peer, commit: TransferCommit) -> Outgoing:
        """Post the COMMIT now and progress at once (it leaves before the loop's other ready
        callbacks run); a failure, now or when UCX reports the send, fails the transfer."""
        out = self._out(peer, commit.transfer_id)
        if out.failed:
            return out
        out.verdict = asyncio.get_running_loop().create_future()
        if out.announced is not None:  # the receiver would hold this COMMIT for them forever
            self._fail(out, f"COMMIT before the {len(out.announced[1])} chunks announced were sent")
            return out
        body, held, out.held = encode_commit(commit), out.held, None
        try:
            if held is not None and wire.fits_inline({**held.head, "commit": body}):
                self._post(out, held, body)  # one message: the last batch carries the COMMIT
            else:
                if held is not None:
                    self._post(out, held)
                for f in self._post_control(out, wire.COMMIT, body):
                    f.add_done_callback(self._failing(out, f"COMMIT to {wire.peer_name(peer.dest)}"))
            self._rt.progress()
        except Exception as e:  # noqa: BLE001 - UCX refused the post
            self._fail(out, f"COMMIT to {wire.peer_name(peer.dest)} failed: {e!r}")
        return out

    async def _verdict(self, out: Outgoing, token_next: bool = False) -> Verdict:
        """The VERDICT of a posted COMMIT (TransferError on any failure or io_timeout_s). The
        transfer's key is kept only for the token's COMMIT of one published ahead of it."""
        try:
            out.raise_if_failed()  # failed before the COMMIT could be posted
            if not await wait_progress(out, out.verdict, self.io_timeout_s, self._rt, self._drop_peer) \
                    and not out.failed:
                self._fail(out, f"no verdict for {out.tid} from {wire.peer_name(out.peer.dest)} in "
                                f"{self.io_timeout_s} s")
            out.raise_if_failed()
            await self._fence_unseen(out, out.verdict.result())
            token_next = token_next and out.verdict.result().published
            return out.verdict.result()
        finally:
            if out.failed:
                await out.settle()
            if self._outs.get(out.tid) is out:
                del self._outs[out.tid]
            if not out.failed and not token_next:  # (a failed one's: its abort takes it)
                self._keys.pop(out.tid, None)

    async def abort(self, dest: str, transfer_id: str, reason: str) -> None:
        # Our own state first, reachable peer or not: a dead peer's chunks' credits return once fenced.
        out = self._outs.get(transfer_id)
        if out is not None and out.peer.dest == dest:
            del self._outs[transfer_id]
            self._fail(out, f"aborted: {reason}")
            await out.settle()
        keyed = self._keys.pop(transfer_id, None)
        if keyed is None:  # never presented: the receiver has no word of ours to take back
            return
        try:
            peer = await self._peer(dest)
        except TransferError as e:
            log.info("abort of %s at %s not delivered: %s", transfer_id, wire.peer_name(dest), e)
            return
        if peer.dead:
            return
        try:
            await self._control(Outgoing(peer, transfer_id, keyed), wire.ABORT, {"reason": reason})
        except Exception as e:  # noqa: BLE001 - abort is best effort by contract
            log.info("abort of %s at %s not delivered: %r", transfer_id, wire.peer_name(dest), e)

    async def close(self) -> None:
        for out in list(self._outs.values()):
            self._fail(out, "sender closed")
        for out in list(self._outs.values()):
            await out.settle()
        self._outs.clear()
        self._keys.clear()
        if self._mailbox is not None:
            await self._mailbox.stop()
            self._mailbox = None

    # -- peers
    async def _peer(self, dest: str) -> Peer:
        peer = self._peers.get(dest)
        if peer is not None and not peer.dead:
            return peer
        fut = self._connecting.get(dest)
        if fut is None:
            fut = self._connecting[dest] = asyncio.ensure_future(self._connect(dest))
            fut.add_done_callback(lambda _: self._connecting.pop(dest, None))
        return await asyncio.shield(fut)

    async def _connect(self, dest: str) -> Peer:
        self._ensure_runtime()
        peer = self._peers[dest] = await connect(self._rt, dest, CreditWindow(self.window_bytes), self.io_timeout_s)
        return peer

    def _drop_peer(self, peer: Peer, reason: str) -> None:
        if peer.dead:
            return
        peer.dead = reason
        log.warning("ucx sender: dropping endpoint to %s: %s", wire.peer_name(peer.dest), reason)
        if self._peers.get(peer.dest) is peer:
            del self._peers[peer.dest]
        if self._rt is not None:
            self._rt.drop(peer.address)
        for out in list(self._outs.values()):
            if out.peer is peer:
                self._fail(out, f"peer dropped: {reason}")

    # -- failure
    def _fail(self, out: Outgoing, reason: str) -> None:
        if out.failed:
            return
        out.failed = reason
        self.stats["failed_transfers"] += 1
        log.info("ucx transfer %s to %s failed: %s", out.tid, wire.peer_name(out.peer.dest), reason)
        if out.verdict is not None and not out.verdict.done():
            out.verdict.set_exception(TransferError(reason))
            out.verdict.exception()  # retrieved
        out.changed.set()
        for c in out.chunks.values():
            if c.credited and c.state != "visible":
                out.fences.append(asyncio.ensure_future(self._fence(out, c)))

    # -- introspection (tests, metrics)
    def metrics(self) -> list[tuple[str, dict, float]]:
        """Samples for runtime.telemetry: totals, and per destination its path and credit."""
        return sender_metrics(self.stats, self._peers.values()) + self.rejected.samples("sender") + \
            runtime_samples(self._rt, self)

    def credit_windows(self) -> dict[str, CreditWindow]:
        return {dest: p.credits for dest, p in self._peers.items()}

    def paths(self) -> dict[str, str]:
        return {dest: p.path for dest, p in self._peers.items()}
