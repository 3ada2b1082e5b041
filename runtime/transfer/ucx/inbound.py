"""The UCX receiver's record of each transfer's sender (`Inbound`), kept from `expect` until
a while after the transfer ended (`Inbounds`), and what it drops (`Rejections`).

An `Inbound` holds the transfer's key, from the Expectation (the router's secret, handed
with Decode.Reserve): a control message counts only if its MAC holds under that key and
its seq is larger than the last one taken (wire.py). Everything the receiver learns
of the sender comes from messages that passed that check: where to reply (its AUTH), and
whether its capability was admitted. Nothing is kept of a peer that proved nothing.

A transfer that ended stays here, as ended, for ENDED_KEEP_S (at most ENDED_MAX of them):
its genuine sender's late message still gets an authenticated answer (the transfer ended,
and why) at once, instead of waiting out its io timeout, and its late chunks' data is taken
off the wire by the receiver (their tags stay registered until then: the runtime's sweep
leaves them to it).

Messages of one transfer are handled in order; while one of them waits (its AUTH's
capability check, an out-of-line body on its way) the ones behind it wait in the
transfer's `lane` (at most LANE_MAX), and every other transfer goes on.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time

from ..keys import TO_RECEIVER, TransferKey
from . import wire

ENDED_KEEP_S = 60.0
ENDED_MAX = 4096
LANE_MAX = 8192
"""Messages one transfer may have waiting behind its slow one (its credit window bounds a
genuine sender far below this; past it the transfer fails)."""
REPLIES_MAX = 8
"""Reply addresses one transfer keeps (one per sender mailbox whose AUTH held; a genuine
transfer has one)."""

REJECT_REASONS = ("malformed", "oversized", "unknown_transfer", "bad_mac", "replay", "unauthorized", "ended",
                  "body_timeout", "body_mismatch", "lane_full", "no_reply_address", "unexpected")
"""pd_dataplane_rejected_total's reasons (docs/observability.md)."""


@dataclasses.dataclass(eq=False, slots=True)
class Inbound:
    """One transfer's sender, as far as it proved itself."""

    key: TransferKey
    last_seq: int = 0
    replies: dict[int, object] = dataclasses.field(default_factory=dict)
    """Endpoints by sender mailbox nonce, each from an AUTH of that mailbox that held."""
    admitted: int = 0
    """The mailbox of the sender the transfer's AUTH admitted (0: none yet): chunks, COMMIT and
    ABORT count from it alone (with security on); replies go to it."""
    lane: collections.deque | None = None
    """Messages waiting behind one in progress; None while none is."""
    ended: str = ""
    """Why the transfer ended ("" while it is live)."""
    ended_at: float = 0.0

    def accept(self, msg: wire.Received) -> str:
        """'' if `msg` is this transfer's sender's next message (its seq taken), else why not."""
        why = msg.check(self.key, TO_RECEIVER, self.last_seq)
        self.last_seq = self.last_seq if why else msg.seq
        return why


class Inbounds:
    """Live transfers' Inbound by transfer id, and the ended ones for a while."""

    def __init__(self, rt):
        self.rt = rt
        self.live: dict[str, Inbound] = {}
        self.ended: collections.OrderedDict[str, Inbound] = collections.OrderedDict()

    def attach(self, rt) -> None:
        """The runtime the tags are registered with (the receiver's, once it started)."""
        self.rt = rt
        for inb in self.live.values():
            self._tags(inb.key, 1)

    def get(self, tid: str) -> Inbound | None:
        inb = self.live.get(tid)
        if inb is None and (inb := self.ended.get(tid)) is not None and time.monotonic() - inb.ended_at > ENDED_KEEP_S:
            self._forget(tid)
            return None
        return inb

    def open(self, tid: str, key: TransferKey) -> Inbound:
        """A transfer now expected (again, when published ahead of its token: as it was); its
        tags registered: sweeps leave them to the receiver."""
        old = self.ended.get(tid)
        if old is not None and old.key is key:
            del self.ended[tid]
            inb = old
        else:
            if old is not None:
                self._forget(tid)
            inb = Inbound(key)
            self._tags(key, 1)
        self.live[tid], inb.ended = inb, ""
        return inb

    def end(self, tid: str, why: str) -> None:
        """The transfer ended: kept as ended for a while (its tags with it)."""
        inb = self.live.pop(tid, None)
        if inb is None:
            return
        for msg, body in inb.lane or ():  # dropped unhandled: a body still posted for one is drained
            if body is not None and not body[1].done():
                asyncio.ensure_future(self.rt.drain(msg.oob_tag)).add_done_callback(
                    lambda f: f.cancelled() or f.exception())
        inb.ended, inb.ended_at, inb.lane = why or "ended", time.monotonic(), None
        self.ended[tid] = inb
        now = inb.ended_at
        while self.ended and (len(self.ended) > ENDED_MAX
                              or now - next(iter(self.ended.values())).ended_at > ENDED_KEEP_S):
            self._forget(next(iter(self.ended)))

    def _forget(self, tid: str) -> None:
        self._tags(self.ended.pop(tid).key, -1)

    def close(self) -> None:
        for tid in list(self.live):
            self.end(tid, "receiver stopped")
        for tid in list(self.ended):
            self._forget(tid)

    def _tags(self, key: TransferKey, count: int) -> None:
        if self.rt is not None:
            self.rt.expect_tags(wire.DATA, key.tag_bits, count)
            self.rt.expect_tags(wire.BODY, key.tag_bits, count)


class Rejections(collections.Counter):
    """Messages dropped, by reason (REJECT_REASONS): pd_dataplane_rejected_total."""

    def add(self, reason: str) -> None:
        """One more message dropped for `reason` (a mailbox's `on_reject`)."""
        self[reason] += 1

    def samples(self, side: str) -> list[tuple[str, dict, float]]:
        return [("pd_dataplane_rejected_total", {"backend": "ucx", "side": side, "reason": r}, n)
                for r, n in sorted(self.items())]
