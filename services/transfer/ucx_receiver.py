"""UCX backend, receiver side: UcxReceiver posts the destination views as UCX receive
buffers and answers each chunk (ucx_wire.py has the messages, ucx_sender.py the other side).

Receiver rules:
  HELLO                     remember the sender's worker address (an endpoint for replies)
  AUTH                      the transfer's capability: checked (KVReceiver.admit) before
                            any receive is posted for it; refused: ERROR, transfer failed.
                            UCX authenticates nobody: the capability is the proof
  CHUNK, unknown transfer   ERROR; its data swallowed (below), nothing written
  duplicate key, refused    Failed for the transfer; ERROR
  key, bad length or sizes
  CHUNK accepted            each of the sender's pieces (its data follows on DATA tags
                            first, first+1, ...) is posted as a receive: straight into
                            the destination view when it lies inside one, else into a
                            staging buffer copied into the views on arrival
  CHUNK refused             its pieces are swallowed (1-byte receives, truncated) so
                            the sender's sends complete
  every piece arrived       checksum over the views: equal -> ChunkArrived + VISIBLE (at
                            the loop turn's end, one for the transfer's chunks landed in it;
                            none for the chunk that releases a held COMMIT: the VERDICT
                            says so); different -> Failed + ERROR. An announced chunk (its
                            header's checksum "": sent before it was hashed) is compared
                            with the COMMIT's checksum, once the COMMIT is here
  a piece failed, or no     Failed for the transfer (its sender died mid-read, or
  data for idle_timeout_s   went silent: one timer per receiver watches them all)
  COMMIT                    held while an accepted chunk is still landing (it follows the
                            chunks at once, or rides in the last batch's CHUNK header:
                            checked with it); then the transfer leaves `pending`, on_commit
                            runs in a task (the token's COMMIT: in the mailbox's turn); VERDICT
                            (refused if it ended meanwhile); published with TOKEN_FOLLOWS:
                            pending again, for the token's COMMIT
  ABORT                     Failed("aborted by sender: ...")

Safety invariant: the only writes into a destination view are UCX receives
posted by this object and the copy out of a staging buffer, which runs only
while the transfer is still pending (re-checked on the event loop's thread right
before it). `fence(tid)` returns only once every receive posted for tid has
completed — by the sender's data, by an error, or by `drain`, which
completes a still-posted receive with one byte from ourselves. After `fence`, no
byte can land in the transfer's views (a late sender's data no longer matches
any posted receive). Every method runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Coroutine

from services.common.tasks import TaskSet

from . import ucx_wire as wire
from .base import UNAUTHORIZED, ChunkArrived, ChunkKey, Expectation, KVReceiver, TransferCommit, checksum, trusts
from .common import decide, destinations, emit, place, scatter
from .tcp_wire import commit_for
from .ucx_runtime import Landing, Mailbox, UcxRuntime, fence_receives, local_host, post_control, runtime

log = logging.getLogger(f"{__package__}.ucx")

STOP_GRACE_S = 5.0
MAX_PIECES = 4096
"""Most sender views in one chunk (its K and V runs: at most 2 per block, so chunks of
up to 2,048 blocks; the CHUNK message listing their sizes stays under its 64 KiB cap)."""


class UcxReceiver(KVReceiver):
    """Accepts pushed chunks into posted views; `address` is ucx://nonce@host/worker-address."""

    def __init__(self, idle_timeout_s: float = 30.0, fence_timeout_s: float = 2.0,
                 host: str = ""):
        """idle_timeout_s: a posted chunk whose data does not arrive in this long fails
        its transfer. fence_timeout_s: how long `fence` waits for posted receives to
        complete by themselves before draining them."""
        if idle_timeout_s <= 0 or fence_timeout_s <= 0:
            raise ValueError("idle_timeout_s and fence_timeout_s must be positive")
        self.idle_timeout_s, self.fence_timeout_s = idle_timeout_s, fence_timeout_s
        self.host = host or local_host()
        super().__init__()
        self.nonce = wire.new_nonce()
        self._rt: UcxRuntime | None = None
        self._mailbox: Mailbox | None = None
        self._senders: dict[int, tuple[bytes, object]] = {}  # nonce -> (address, endpoint)
        self._posted: dict[str, list[tuple[int, asyncio.Future, bool]]] = {}  # (tag, receive, into staging)
        self._last_heard: dict[str, float] = {}  # pending transfers that sent something
        self._idle_timer: asyncio.TimerHandle | None = None  # due when the oldest of them idles out
        self._claimed: dict[str, set[ChunkKey]] = {}  # keys accepted (in flight or landed)
        self._held: dict[str, tuple[int, TransferCommit]] = {}  # COMMITs behind chunks in flight
        self._unverified: dict[str, list] = {}  # announced chunks landed before their COMMIT: (serial, entries, sums)
        self._visible: dict[tuple[int, str], list[int]] = {}  # chunks landed this turn, VISIBLE soon
        self._token_next: set[str] = set()  # published ahead of their token: its COMMIT is next
        self._tasks = TaskSet(on_error=lambda e: log.warning("ucx receiver task failed: %r", e))
        self._oob = itertools.count(1)
        self.stats = dict(chunks=0, bytes=0, failed_transfers=0, drained=0, carried_commits=0)

    @property
    def address(self) -> str:
        if self._rt is None:
            raise RuntimeError("UcxReceiver.address: not started")
        return wire.format_address(self.nonce, self.host, os.getpid(), self._rt.address)

    async def start(self) -> None:
        self._rt = runtime()
        self._mailbox = Mailbox(self._rt, wire.tag(wire.CTRL, self.nonce), self._on_message,
                                f"ucx-receiver-{self.nonce:x}", wants_body=self._wants_body)
        self._mailbox.start()
        log.info("ucx receiver %x at %s: transports %s", self.nonce, self.host,
                 ",".join(self._rt.transports))

    async def stop(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._mailbox is not None:
            await self._mailbox.stop()
            self._mailbox = None
        for tid in list(self.pending):
            self._fail(tid, "receiver stopped")
        for tid in list(self._posted):
            await self.fence(tid)
        await self._tasks.settle(STOP_GRACE_S)

    def _drop(self, transfer_id: str) -> None:
        self._token_next.discard(transfer_id)
        self._last_heard.pop(transfer_id, None)
        self._claimed.pop(transfer_id, None)
        self._unverified.pop(transfer_id, None)
        held = self._held.pop(transfer_id, None)
        if held is not None:  # forgotten with its COMMIT waiting: the sender hears it now
            self._reply(held[0], wire.VERDICT, transfer_id, {"published": False, "reason": "transfer forgotten"})

    def _heard(self, tid: str) -> None:
        """A message of pending transfer tid arrived: restart its idle clock (one timer per
        receiver; a task per transfer held each one's state for idle_timeout_s after it ended)."""
        loop = asyncio.get_running_loop()
        self._last_heard[tid] = loop.time()
        if self._idle_timer is None:
            self._idle_timer = loop.call_later(self.idle_timeout_s, self._idle_check)

    def _idle_check(self) -> None:
        """Fail each started transfer whose sender said nothing for idle_timeout_s (UCX, error
        handling off, is silent about a dead sender; a chunk whose data never comes ends so)."""
        loop, self._idle_timer = asyncio.get_running_loop(), None
        now = loop.time()
        for tid, heard in list(self._last_heard.items()):
            if now - heard >= self.idle_timeout_s - 1e-3:  # (a timer may run a hair early)
                self._fail(tid, f"sender idle for {self.idle_timeout_s} s")  # its clock goes (_drop)
        if self._last_heard:
            self._idle_timer = loop.call_at(min(self._last_heard.values()) + self.idle_timeout_s, self._idle_check)

    async def fence(self, transfer_id: str) -> None:
        posted = self._posted.pop(transfer_id, [])
        self.stats["drained"] += await fence_receives(self._rt, posted, self.fence_timeout_s, STOP_GRACE_S, transfer_id)

    # -- messages (mailbox, in arrival order)
    async def _on_message(self, kind: int, tid: str, nonce: int, body: dict) -> None:
        if kind == wire.HELLO:
            await self._on_hello(nonce, body)
            return
        if nonce not in self._senders:
            log.warning("ucx receiver: %s from unknown sender %x dropped",
                        wire.KIND_NAMES.get(kind), nonce)
            if kind in (wire.CHUNK, wire.COMMIT):
                self._fail(tid, "chunk from a sender that never said HELLO")
            return
        exp = self.pending.get(tid)
        if exp is not None and not trusts(exp, nonce) and kind != wire.AUTH:
            self._untrusted(kind, nonce, tid, body)
            return
        if exp is not None:
            self._heard(tid)
        if kind == wire.CHUNK:
            self._on_chunk(nonce, tid, body)
        elif kind == wire.COMMIT:
            if (deciding := self._on_commit(nonce, tid, body)) is not None:
                await deciding
        elif kind == wire.AUTH:
            why = await self.admit(tid, body or {}, None, nonce)
            if why:
                self._reply(nonce, wire.ERROR, tid, {"reason": why})
        elif kind == wire.ABORT:
            self._fail(tid, f"aborted by sender: {body.get('reason', '')}")
        else:
            log.warning("ucx receiver: unexpected %s for %s", wire.KIND_NAMES.get(kind), tid)

    async def _on_hello(self, nonce: int, body: dict) -> None:
        try:
            address = wire.unb64(str(body["address"]))
            ep = await self._rt.endpoint(address)
        except Exception as e:  # noqa: BLE001 - bad address or UCX error: ignore the sender
            log.warning("ucx receiver: HELLO from %x unusable: %r", nonce, e)
            return
        self._senders[nonce] = (address, ep)

    def _on_chunk(self, nonce: int, tid: str, body: dict) -> None:
        exp = self.pending.get(tid)
        try:
            serial, entries, sizes, first = wire.chunk_header(body)
            if first >> 60 != wire.DATA or len(sizes) > MAX_PIECES or not 0 < len(entries) <= MAX_PIECES:
                raise ValueError(f"data tag {first:#x} / {len(sizes)} pieces / {len(entries)} chunks")
        except (KeyError, TypeError, ValueError, IndexError) as e:
            self._reject(nonce, tid, exp, f"malformed CHUNK: {e!r}")
            return
        if exp is None:
            self._swallow(first, len(sizes))
            self._reply(nonce, wire.ERROR, tid, {"reason": f"transfer {tid} not expected"})
            return
        claimed = self._claimed.setdefault(tid, set())
        keys = [c.key for c in entries]
        per, problem = destinations(exp, entries, claimed) if len(set(keys)) == len(keys) else (
            [], f"duplicate chunk in batch {keys}")
        if not problem and (min(sizes, default=0) <= 0 or sum(sizes) != sum(c.num_bytes for c in entries)):
            problem = f"chunk {keys[0]}: sender views {sizes[:4]}... do not add up to its bytes"
        carried = None  # a COMMIT in the header (the sender's last batch): held as if right behind it
        if not problem and "commit" in body:
            raw = body["commit"]  # its manifest is usually this very batch: decoded once
            same = "batch" in body and type(raw) is dict and raw.get("chunks") == body["batch"]
            carried, problem = (None, "a second COMMIT") if tid in self._held else commit_for(
                raw, tid, tuple(entries) if same else None)
        if problem:
            self._swallow(first, len(sizes))
            self._reject(nonce, tid, exp, problem)
            return
        claimed.update(keys)
        if carried is not None:
            self._held[tid] = (nonce, carried)
            self.stats["carried_commits"] += 1
        posted, staged, fenced = [], [], self._posted.setdefault(tid, [])
        for i, parts in enumerate(place([v for views in per for v in views], sizes)):
            t = first + i  # inside one view: straight into the cache memory; else one staging buffer, one copy
            buf = parts[0] if len(parts) == 1 else bytearray(sizes[i])
            if len(parts) > 1:
                staged.append((buf, parts))
            posted.append((t, self._rt.post_recv(buf, t)))
            fenced.append((*posted[-1], len(parts) > 1))  # (a staging receive holds no cache memory)
        land = Landing(len(posted), lambda: self._land(nonce, tid, exp, serial, entries, per, posted, staged))
        for _, f in posted:
            f.add_done_callback(land.piece_done)

    def _untrusted(self, kind: int, nonce: int, tid: str, body: dict) -> None:
        """A CHUNK, COMMIT or ABORT from a sender whose credential was not accepted: refused,
        its data swallowed; the transfer goes on for the sender that holds the capability."""
        if kind == wire.CHUNK:
            try:
                self._swallow(int(body["tag"]), min(len(body["sizes"]), MAX_PIECES))
            except (KeyError, TypeError, ValueError):
                pass
            self._reply(nonce, wire.ERROR, tid, {"reason": UNAUTHORIZED})
        elif kind == wire.COMMIT:
            self._reply(nonce, wire.VERDICT, tid, {"published": False, "reason": UNAUTHORIZED})
        else:
            log.warning("ucx receiver: %s for %s from unauthorized sender %x ignored",
                        wire.KIND_NAMES.get(kind), tid, nonce)

    def _swallow(self, first_tag: int, count: int) -> None:
        """A refused chunk's data off the wire: a 1-byte receive per piece completes (truncated)."""
        for i in range(count):  # (each completes truncated: its exception retrieved)
            self._rt.post_recv(bytearray(1), first_tag + i).add_done_callback(lambda f: f.cancelled() or f.exception())

    def _land(self, nonce: int, tid: str, exp: Expectation, serial: int, entries: list, per: list,
              posted: list, staged: list) -> None:
        """Every piece of a chunk completed: verify, then VISIBLE (or fail the transfer)."""
        if self.pending.get(tid) is not exp:
            return  # forgotten, failed or committed meanwhile; fence() owns the receives
        errors = [f.exception() for _, f in posted if not f.cancelled() and f.exception() is not None]
        if errors:
            self._fail(tid, f"chunk {entries[0].key}: receive failed (sender lost?): {errors[0]!r}")
            return
        for buf, parts in staged:  # still pending (checked above): the views are ours
            scatter(buf, parts)
        self.stats["staged_pieces"] = self.stats.get("staged_pieces", 0) + len(staged)
        sums = [checksum(views) for views in per]
        if tid not in self._held and any(not c.checksum for c in entries):  # announced: the COMMIT has them
            self._unverified.setdefault(tid, []).append((serial, entries, sums))
            return
        self._verified(nonce, tid, exp, serial, entries, sums)

    def _verified(self, nonce: int, tid: str, exp: Expectation, serial: int, entries: list, sums: list[str]) -> None:
        """A message's chunks landed and hashed (`sums`): each equal to its checksum (an
        announced one's: the held COMMIT's) -> ChunkArrived, then VISIBLE or the COMMIT's
        decision; else the transfer fails."""
        announced = tid in self._held and not all(c.checksum for c in entries)  # (else no lookup to build)
        listed = {c.key: c.checksum for c in self._held[tid][1].chunks} if announced else {}
        for c, got in zip(entries, sums):
            if got != (want := c.checksum or listed.get(c.key, "none in the COMMIT")):
                self._reject(nonce, tid, exp, f"checksum mismatch in chunk {c.key}: sender {want}, received {got}")
                return
        self._heard(tid)
        self.stats["chunks"] += len(entries)
        self.stats["bytes"] += sum(c.num_bytes for c in entries)
        for c, got in zip(entries, sums):
            arrived = exp.received[c.key] = ChunkArrived(tid, c.key, c.num_bytes, got)
            emit(exp, arrived)
        held = self._held.get(tid)
        if held is not None and not self._in_flight(tid, exp):  # its VERDICT says it landed
            del self._held[tid]
            if (deciding := self._close(held[0], tid, exp, held[1])) is not None:
                self._tasks.spawn(deciding)
        else:
            self._visible_soon(nonce, tid, serial)

    def _visible_soon(self, nonce: int, tid: str, serial: int) -> None:
        """VISIBLE for `serial`, in one message with tid's other chunks landed in this turn."""
        self._visible.setdefault((nonce, tid), []).append(serial)
        if len(self._visible) == 1 and len(self._visible[(nonce, tid)]) == 1:
            asyncio.get_running_loop().call_soon(self._flush_visible)

    def _flush_visible(self) -> None:
        visible, self._visible = self._visible, {}
        for (nonce, tid), serials in visible.items():
            self._reply(nonce, wire.VISIBLE, tid, {"serials": serials})

    def _wants_body(self, kind: int, tid: str, nonce: int) -> bool:
        """An out-of-line body is received only from a sender that said HELLO (anyone else
        could stall the mailbox with bodies that never come), and a COMMIT's (up to 8 MiB)
        only for a transfer this receiver expects."""
        return nonce in self._senders and (kind not in (wire.COMMIT, wire.AUTH) or tid in self.pending)

    def _on_commit(self, nonce: int, tid: str, body: dict | None) -> Coroutine | None:
        exp = self.pending.get(tid)
        if exp is None or body is None:
            self._reply(nonce, wire.VERDICT, tid, {"published": False,
                                                   "reason": f"transfer {tid} not expected"})
            return
        commit, why = commit_for(body, tid)
        if why or tid in self._held:
            self._reject(nonce, tid, exp, why or "a second COMMIT")
        elif self._in_flight(tid, exp):  # decided when the last of them lands (`_land`)
            self._held[tid] = (nonce, commit)
            for serial, entries, sums in self._unverified.pop(tid, ()):  # landed ahead of their checksums
                if self.pending.get(tid) is exp:
                    self._verified(nonce, tid, exp, serial, entries, sums)
        else:
            return self._close(nonce, tid, exp, commit)
        return None

    def _in_flight(self, tid: str, exp: Expectation) -> bool:  # an accepted chunk not landed yet
        return any(key not in exp.received for key in self._claimed.get(tid, ()))

    def _close(self, nonce: int, tid: str, exp: Expectation, commit: TransferCommit) -> Coroutine | None:
        """The COMMIT ends the transfer here: no more chunks, no Failed from stop/idle. It is
        decided in a task; the token's COMMIT of a transfer published ahead of it (its listener
        only admits) is returned instead, for the mailbox to await: one loop turn less."""
        del self.pending[tid]
        token = tid in self._token_next and not commit.chunks
        self._drop(tid)  # (no COMMIT held here: none, or `_land` took it)
        deciding = self._decide(nonce, exp, commit)
        if token:
            return deciding
        self._tasks.spawn(deciding)
        return None

    async def _decide(self, nonce: int, exp: Expectation, commit: TransferCommit) -> None:
        verdict = await decide(exp, commit)
        self._reopen(exp, commit, verdict)
        if self.pending.get(exp.transfer_id) is exp:  # published ahead: its token's COMMIT comes next
            self._token_next.add(exp.transfer_id)
        self._reply(nonce, wire.VERDICT, exp.transfer_id, {"published": verdict.published, "reason": verdict.reason})

    def metrics(self) -> list[tuple[str, dict, float]]:
        """Samples for services.telemetry: totals, pending transfers, and the transports."""
        labels = {"backend": "ucx", "transports": ",".join(self._rt.transports if self._rt else [])}
        return [(f"pd_transfer_received_{k}_total", labels, v) for k, v in self.stats.items()] + [
            ("pd_transfer_pending", labels, len(self.pending))]

    # -- helpers
    def _reject(self, nonce: int, tid: str, exp: Expectation | None, reason: str) -> None:
        if exp is not None and self.pending.get(tid) is exp:
            self._fail(tid, reason)
        self._reply(nonce, wire.ERROR, tid, {"reason": reason})

    def _fail(self, tid: str, reason: str) -> None:
        if tid in self.pending:
            self.stats["failed_transfers"] += 1
        held = self._held.pop(tid, None)
        if held is not None:  # its COMMIT waited: the sender hears why
            self._reply(held[0], wire.ERROR, tid, {"reason": reason})
        super()._fail(tid, reason)

    def _reply(self, nonce: int, kind: int, tid: str, body: dict) -> None:
        """Post a reply now (in order with earlier replies); errors are only logged —
        a sender that hears nothing times out on its side."""
        entry = self._senders.get(nonce)
        if entry is None:
            return
        try:
            futs = post_control(self._rt, entry[1], wire.tag(wire.REPLY, nonce), kind, tid,
                                self.nonce, body, lambda: next(self._oob))
        except Exception as e:  # noqa: BLE001 - UCX refused the post
            log.warning("ucx receiver: reply %s for %s not posted: %r", wire.KIND_NAMES.get(kind), tid, e)
            return
        for f in futs:
            f.add_done_callback(_log_reply_error)


def _log_reply_error(f: asyncio.Future) -> None:
    if not f.cancelled() and f.exception() is not None:
        log.info("ucx receiver: a reply was not delivered: %r", f.exception())
