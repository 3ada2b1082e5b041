"""UCX backend, receiver side: UcxReceiver posts the destination views as UCX receive
buffers and answers each chunk (wire.py has the messages, sender.py the other side).

Every control message passes intake.py first (its MAC under the transfer's key, its
seq, the sender admitted); these are the rules for what passes:

  AUTH                      the transfer's capability: checked (KVReceiver.admit) before
                            any receive is posted for it; refused: ERROR, the transfer goes on
  CHUNK, refused            (a duplicate or unexpected key, a bad length or sizes, data tags
                            not the transfer's) Failed for the transfer; ERROR; its data
                            swallowed (1-byte receives, truncated) so the sender's sends complete
  CHUNK accepted            each of the sender's pieces (its data follows on DATA tags
                            first, first+1, ...) is posted as a receive: straight into
                            the destination view when it lies inside one, else into a
                            staging buffer copied into the views on arrival
  every piece arrived       its keyed checksum over the views (keys.py: only the key's holder
                            can make it): equal -> ChunkArrived + VISIBLE (at the loop turn's
                            end, one for the transfer's chunks landed in it; none for the
                            chunk that releases a held COMMIT: the VERDICT says so); different
                            -> Failed + ERROR. An announced chunk (its header's checksum "":
                            sent before it was hashed) is compared with the COMMIT's checksum,
                            once the COMMIT is here
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
import time
from collections.abc import Coroutine

from runtime.common.tasks import TaskSet

from ..base import (
    ChunkArrived,
    ChunkKey,
    Expectation,
    KVReceiver,
    MissingTransferKey,
    TransferCommit,
    Verdict,
    chunk_checksum,
)
from ..common import decide, destinations, emit, place, scatter
from ..tcp.wire import commit_for
from . import wire
from .inbound import Inbounds, Rejections
from .intake import Intake
from .mailbox import Mailbox
from .runtime import Landing, UcxRuntime, fence_receives, local_host, runtime, runtime_samples

log = logging.getLogger(f"{__package__}.ucx")

STOP_GRACE_S = 5.0
VISIBLE_MAX = 4096
"""Serials in one VISIBLE (a reply always travels inline)."""
MAX_PIECES = 4096
"""Most sender views in one chunk (its K and V runs: at most 2 per block, so chunks of
up to 2,048 blocks; the CHUNK message listing their sizes stays under its 64 KiB cap)."""


class UcxReceiver(Intake, KVReceiver):
    """Accepts pushed chunks into posted views; `address` is ucx://w2.nonce@host:pid/worker-address
    (the nonce names its mailbox: it routes, it proves nothing)."""

    MAX_PIECES = MAX_PIECES

    def __init__(self, idle_timeout_s: float = 30.0, fence_timeout_s: float = 2.0,
                 host: str = "", body_timeout_s: float = 10.0):
        """idle_timeout_s: a posted chunk whose data does not arrive in this long fails
        its transfer. fence_timeout_s: how long `fence` waits for posted receives to
        complete by themselves before draining them. body_timeout_s: how long an
        out-of-line body may take after its (authenticated) head."""
        if idle_timeout_s <= 0 or fence_timeout_s <= 0 or body_timeout_s <= 0:
            raise ValueError("idle_timeout_s, fence_timeout_s and body_timeout_s must be positive")
        self.idle_timeout_s, self.fence_timeout_s = idle_timeout_s, fence_timeout_s
        self.body_timeout_s = body_timeout_s
        self.host = host or local_host()
        super().__init__()
        self.nonce = wire.new_nonce()
        self._rt: UcxRuntime | None = None
        self._mailbox: Mailbox | None = None
        self._in = Inbounds(None)  # each expected transfer's sender, as far as it proved itself
        self._seq = itertools.count(time.time_ns())  # our replies' seq
        self.rejected = Rejections()
        self._posted: dict[str, list[tuple[int, asyncio.Future, bool]]] = {}  # (tag, receive, into staging)
        self._last_heard: dict[str, float] = {}  # pending transfers that sent something
        self._idle_timer: asyncio.TimerHandle | None = None  # due when the oldest of them idles out
        self._claimed: dict[str, set[ChunkKey]] = {}  # keys accepted (in flight or landed)
        self._held: dict[str, TransferCommit] = {}  # COMMITs behind chunks in flight
        self._unverified: dict[str, list] = {}  # announced chunks landed before their COMMIT: (serial, entries, sums)
        self._visible: dict[str, list[int]] = {}  # chunks landed this turn, VISIBLE soon
        self._token_next: set[str] = set()  # published ahead of their token: its COMMIT is next
        self._tasks = TaskSet(on_error=lambda e: log.warning("ucx receiver task failed: %r", e))
        self.stats = dict(chunks=0, bytes=0, failed_transfers=0, drained=0, carried_commits=0)

    @property
    def address(self) -> str:
        if self._rt is None:
            raise RuntimeError("UcxReceiver.address: not started")
        return wire.format_address(self.nonce, self.host, os.getpid(), self._rt.address)

    async def start(self) -> None:
        self._rt = runtime()
        self._rt.exporter = self._rt.exporter or self
        self._in.attach(self._rt)
        self._mailbox = Mailbox(self._rt, wire.tag(wire.CTRL, self.nonce), self._on_message, "ucx-receiver",
                                on_reject=self.rejected.add)
        self._mailbox.start()
        log.info("ucx receiver at %s: transports %s", self.host, ",".join(self._rt.transports))

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
        self._in.close()
        await self._tasks.settle(STOP_GRACE_S)

    def key_required(self, secured: bool) -> bool:
        return secured  # no TLS here: with security on, the key is what binds a message to its sender

    def expect(self, expectation: Expectation) -> None:
        """As KVReceiver.expect; a transfer with an `authorize` (security on) must come with its
        key (MissingTransferKey): over UCX nothing else ties a message to its sender."""
        if expectation.authorize is not None and not expectation.key:
            raise MissingTransferKey(f"transfer {expectation.transfer_id}: a secured UCX transfer needs its key "
                                     "(Decode.Reserve's transfer_key; the router mints one per attempt)")
        super().expect(expectation)
        self._in.open(expectation.transfer_id, expectation.tkey)

    def _reopen(self, exp: Expectation, commit: TransferCommit, verdict: Verdict) -> None:
        super()._reopen(exp, commit, verdict)
        if self.pending.get(exp.transfer_id) is exp:  # pending again: its sender too, as it was
            self._in.open(exp.transfer_id, exp.tkey)

    def _drop(self, transfer_id: str, why: str = "forgotten") -> None:
        self._token_next.discard(transfer_id)
        self._last_heard.pop(transfer_id, None)
        self._claimed.pop(transfer_id, None)
        self._unverified.pop(transfer_id, None)
        if self._held.pop(transfer_id, None) is not None:  # forgotten with its COMMIT waiting: the sender hears it
            self._reply(transfer_id, wire.VERDICT, {"published": False, "reason": "transfer forgotten"})
        self._in.end(transfer_id, why)

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

    # -- the receiver's rules (intake.py checked each message first)
    def _on_chunk(self, tid: str, body: dict) -> None:
        exp, bits = self.pending.get(tid), self._in.live[tid].key.tag_bits
        try:
            serial, entries, sizes, first = wire.chunk_header(body)
            kind, tag_bits, counter = wire.tag_parts(first)
            if (kind, tag_bits) != (wire.DATA, bits) or counter + len(sizes) > wire.COUNTER_SPAN or \
                    len(sizes) > MAX_PIECES or not 0 < len(entries) <= MAX_PIECES:
                raise ValueError(f"data tag {first:#x} (not the transfer's) / {len(sizes)} pieces / "
                                 f"{len(entries)} chunks")
        except (KeyError, TypeError, ValueError, IndexError) as e:
            self._reject(tid, exp, f"malformed CHUNK: {e!r}")
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
            self._reject(tid, exp, problem)
            return
        claimed.update(keys)
        if carried is not None:
            self._held[tid] = carried
            self.stats["carried_commits"] += 1
        posted, staged, fenced = [], [], self._posted.setdefault(tid, [])
        for i, parts in enumerate(place([v for views in per for v in views], sizes)):
            t = first + i  # inside one view: straight into the cache memory; else one staging buffer, one copy
            buf = parts[0] if len(parts) == 1 else bytearray(sizes[i])
            if len(parts) > 1:
                staged.append((buf, parts))
            posted.append((t, self._rt.post_recv(buf, t)))
            fenced.append((*posted[-1], len(parts) > 1))  # (a staging receive holds no cache memory)
        land = Landing(len(posted), lambda: self._land(tid, exp, serial, entries, per, posted, staged))
        for _, f in posted:
            f.add_done_callback(land.piece_done)

    def _swallow(self, first_tag: int, count: int) -> None:
        """A refused chunk's data off the wire: a 1-byte receive per piece completes (truncated)."""
        for i in range(count):  # (each completes truncated: its exception retrieved)
            self._rt.post_recv(bytearray(1), first_tag + i).add_done_callback(lambda f: f.cancelled() or f.exception())

    def _land(self, tid: str, exp: Expectation, serial: int, entries: list, per: list,
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
        sums = [chunk_checksum(exp.tkey, c.key, views) for c, views in zip(entries, per)]
        if tid not in self._held and any(not c.checksum for c in entries):  # announced: the COMMIT has them
            self._unverified.setdefault(tid, []).append((serial, entries, sums))
            return
        self._verified(tid, exp, serial, entries, sums)

    def _verified(self, tid: str, exp: Expectation, serial: int, entries: list, sums: list[str]) -> None:
        """A message's chunks landed and hashed (`sums`): each equal to its checksum (an
        announced one's: the held COMMIT's) -> ChunkArrived, then VISIBLE or the COMMIT's
        decision; else the transfer fails (the value computed is never told: keys.py)."""
        announced = tid in self._held and not all(c.checksum for c in entries)  # (else no lookup to build)
        listed = {c.key: c.checksum for c in self._held[tid].chunks} if announced else {}
        for c, got in zip(entries, sums):
            if got != (want := c.checksum or listed.get(c.key, "none in the COMMIT")):
                self._reject(tid, exp, f"checksum mismatch in chunk {c.key}: sender {want}, received other bytes")
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
            if (deciding := self._close(tid, exp, held)) is not None:
                self._tasks.spawn(deciding)
        else:
            self._visible_soon(tid, serial)

    def _visible_soon(self, tid: str, serial: int) -> None:
        """VISIBLE for `serial`, in one message with tid's other chunks landed in this turn."""
        self._visible.setdefault(tid, []).append(serial)
        if len(self._visible) == 1 and len(self._visible[tid]) == 1:
            asyncio.get_running_loop().call_soon(self._flush_visible)

    def _flush_visible(self) -> None:
        visible, self._visible = self._visible, {}
        for tid, serials in visible.items():
            for i in range(0, len(serials), VISIBLE_MAX):  # each reply inline
                self._reply(tid, wire.VISIBLE, {"serials": serials[i:i + VISIBLE_MAX]})

    def _on_commit(self, tid: str, body: dict) -> Coroutine | None:
        exp = self.pending[tid]
        commit, why = commit_for(body, tid)
        if why or tid in self._held:
            self._reject(tid, exp, why or "a second COMMIT")
        elif self._in_flight(tid, exp):  # decided when the last of them lands (`_land`)
            self._held[tid] = commit
            for serial, entries, sums in self._unverified.pop(tid, ()):  # landed ahead of their checksums
                if self.pending.get(tid) is exp:
                    self._verified(tid, exp, serial, entries, sums)
        else:
            return self._close(tid, exp, commit)
        return None

    def _in_flight(self, tid: str, exp: Expectation) -> bool:  # an accepted chunk not landed yet
        return any(key not in exp.received for key in self._claimed.get(tid, ()))

    def _close(self, tid: str, exp: Expectation, commit: TransferCommit) -> Coroutine | None:
        """The COMMIT ends the transfer here: no more chunks, no Failed from stop/idle. It is
        decided in a task; the token's COMMIT of a transfer published ahead of it (its listener
        only admits) is returned instead, for the mailbox to await: one loop turn less."""
        del self.pending[tid]
        token = tid in self._token_next and not commit.chunks
        self._drop(tid, "committed")  # (no COMMIT held here: none, or `_land` took it)
        deciding = self._decide(exp, commit)
        if token:
            return deciding
        self._tasks.spawn(deciding)
        return None

    async def _decide(self, exp: Expectation, commit: TransferCommit) -> None:
        verdict = await decide(exp, commit)
        self._reopen(exp, commit, verdict)
        if self.pending.get(exp.transfer_id) is exp:  # published ahead: its token's COMMIT comes next
            self._token_next.add(exp.transfer_id)
        self._reply(exp.transfer_id, wire.VERDICT, {"published": verdict.published, "reason": verdict.reason})

    def metrics(self) -> list[tuple[str, dict, float]]:
        """Samples for runtime.telemetry: totals, pending transfers, the transports, and what
        the receiver dropped (with the runtime's sweeps, when it reports them)."""
        labels = {"backend": "ucx", "transports": ",".join(self._rt.transports if self._rt else [])}
        out = [(f"pd_transfer_received_{k}_total", labels, v) for k, v in self.stats.items()] + [
            ("pd_transfer_pending", labels, len(self.pending))]
        return out + self.rejected.samples("receiver") + runtime_samples(self._rt, self)

    # -- helpers
    def _reject(self, tid: str, exp: Expectation | None, reason: str) -> None:
        """The transfer's genuine sender broke a rule: the transfer fails, the sender hears why."""
        if exp is not None and self.pending.get(tid) is exp:
            self._fail(tid, reason)
        self._reply(tid, wire.ERROR, {"reason": reason})

    def _fail(self, tid: str, reason: str) -> None:
        if tid in self.pending:
            self.stats["failed_transfers"] += 1
        if self._held.pop(tid, None) is not None:  # its COMMIT waited: the sender hears why
            self._reply(tid, wire.ERROR, {"reason": reason})
        self._in.end(tid, reason)
        super()._fail(tid, reason)
