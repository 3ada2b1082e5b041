"""The UCX receiver's way in: every control message is checked here before the receiver's
rules (receiver.py) see it, and replies leave from here.

    its transfer is not one this receiver knows    dropped: unknown_transfer
    its MAC does not hold under the transfer's key  dropped: bad_mac
    its seq is not above the last one taken         dropped: replay
    the transfer ended (a while ago at most)        answered at once: the transfer ended
    AUTH                                            the reply address it names is taken,
                                                    then the capability (KVReceiver.admit),
                                                    in the transfer's lane
    CHUNK, COMMIT, ABORT of a sender not admitted   refused (ERROR / VERDICT), the transfer goes on
                                                    (a sender is its mailbox: the key's holders
                                                    are told apart by the head's sender)
    an out-of-line body                             received after its head held, in the
                                                    transfer's lane, for body_timeout_s at most

Dropped messages are counted by reason (`rejected`: pd_dataplane_rejected_total) and
answered with nothing: a peer that proved nothing gets no endpoint, no state, no wait and
no reply. A mixin of `UcxReceiver`: it uses the receiver's `_rt`, `_in`, `_seq`,
`rejected`, `pending`, `_tasks`, `body_timeout_s`, `admit`, `_fail`, `_heard` and its rules
`_on_chunk`, `_on_commit`, `_swallow`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Coroutine

from ..base import UNAUTHORIZED, trusts
from ..keys import TO_SENDER
from . import wire
from .inbound import LANE_MAX, REPLIES_MAX, Inbound
from .mailbox import post_control

log = logging.getLogger(f"{__package__}.ucx")

FROM_SENDERS = (wire.AUTH, wire.CHUNK, wire.COMMIT, wire.ABORT)


class Intake:
    """Checks, orders and answers a UcxReceiver's control messages."""

    def _on_message(self, msg: wire.Received) -> Coroutine | None:
        """The mailbox's handler: what it returns (a token's COMMIT, local work) it awaits."""
        inb = self._in.get(msg.transfer_id)
        why = "unknown_transfer" if inb is None else inb.accept(msg)
        if why or msg.kind not in FROM_SENDERS:
            self.rejected[why or "malformed"] += 1
            return None
        if inb.ended:
            self._after_end(inb, msg)
            return None
        body = None
        if msg.oob_tag:  # the head held: its body may be taken now
            buf = bytearray(msg.body_len)
            body = (buf, self._rt.post_recv(buf, msg.oob_tag))
        if inb.lane is not None:
            if len(inb.lane) >= LANE_MAX:
                self.rejected["lane_full"] += 1
                self._fail(msg.transfer_id, f"more than {LANE_MAX} messages behind one in progress")
                return None
            inb.lane.append((msg, body))
            return None
        if body is not None or msg.kind == wire.AUTH:
            inb.lane = collections.deque()
            self._tasks.spawn(self._run_lane(inb, msg, body))
            return None
        obj = self._parsed(msg, None)
        return None if obj is None else self._handle(inb, msg, obj)

    async def _run_lane(self, inb: Inbound, msg: wire.Received, body) -> None:
        """The transfer's messages in order, from `msg` until none waits behind."""
        try:
            while True:
                if body is not None:
                    body = await self._body(msg, body)  # None: it did not come (the transfer failed)
                obj = None if msg.oob_tag and body is None else self._parsed(msg, body)
                if obj is not None and (deciding := self._handle(inb, msg, obj)) is not None:
                    await deciding
                if not inb.lane:  # (None: the transfer ended; what waited there is dropped)
                    return
                msg, body = inb.lane.popleft()
        finally:
            if not inb.ended:
                inb.lane = None

    async def _body(self, msg: wire.Received, body) -> bytes | None:
        """The out-of-line body of a head that held, within body_timeout_s; None (and the
        transfer failed) if it does not come whole and equal to the digest the head named."""
        buf, got = body
        await asyncio.wait([got], timeout=self.body_timeout_s)  # never cancels ucxx's future
        if not got.done():
            await self._rt.drain(msg.oob_tag)
            reason = "body_timeout"
        else:
            reason = "body_mismatch" if got.exception() is not None or not msg.body_matches(bytes(buf)) else ""
        if reason:
            self.rejected[reason] += 1
            self._fail(msg.transfer_id, f"{wire.KIND_NAMES[msg.kind]}'s body: {reason.replace('_', ' ')}")
            return None
        return bytes(buf)

    def _parsed(self, msg: wire.Received, body: bytes | None) -> dict | None:
        """The message's body (its out-of-line `body`, when it has one) as an object; a genuine
        sender's body that is not one fails its transfer."""
        try:
            return wire.json_body(body) if msg.oob_tag else msg.body()
        except wire.ProtocolError as e:
            self.rejected["malformed"] += 1
            self._fail(msg.transfer_id, f"malformed {wire.KIND_NAMES[msg.kind]} body: {e}")
            return None

    def _handle(self, inb: Inbound, msg: wire.Received, obj: dict) -> Coroutine | None:
        tid, kind = msg.transfer_id, msg.kind
        if kind == wire.AUTH:
            return self._auth(inb, msg.sender, tid, obj)
        exp = self.pending.get(tid)
        if exp is None:  # ended while this waited in its lane
            self._after_end(inb, msg, obj)
            return None
        if not trusts(exp, msg.sender):
            self._untrusted(kind, tid, obj, msg.sender)
            return None
        self._heard(tid)
        if kind == wire.CHUNK:
            self._on_chunk(tid, obj)
        elif kind == wire.COMMIT:
            return self._on_commit(tid, obj)
        else:
            self._fail(tid, f"aborted by sender: {str(obj.get('reason', ''))[:512]}")
        return None

    async def _auth(self, inb: Inbound, sender: int, tid: str, obj: dict) -> None:
        """Where the sender takes replies (it holds the key: the MAC held), then its
        capability; refused: ERROR, and the transfer goes on for a sender it admits."""
        confirm = obj.pop("confirm", False) is True
        if not await self._reply_to(inb, sender, obj.pop("reply", None)):
            return
        why = await self.admit(tid, obj, None, sender)
        if why:
            self._reply(tid, wire.ERROR, {"reason": why}, to=sender)
            return
        inb.admitted = sender
        if confirm:
            self._reply(tid, wire.ADMITTED, {}, to=sender)

    async def _reply_to(self, inb: Inbound, sender: int, reply) -> bool:
        """An endpoint for replies to `sender`'s mailbox at the address its AUTH names."""
        try:
            if not 0 < sender < 1 << wire.NONCE_BITS or len(inb.replies) >= REPLIES_MAX and sender not in inb.replies:
                raise ValueError(f"mailbox {sender} (or more than {REPLIES_MAX} of them)")
            inb.replies[sender] = await self._rt.endpoint(wire.unb64(str(reply["address"])))
        except Exception as e:  # noqa: BLE001 - a bad address or a UCX error: no reply possible
            log.debug("ucx receiver: AUTH's reply address unusable: %r", e)
            self.rejected["no_reply_address"] += 1
            return False
        return True

    def _untrusted(self, kind: int, tid: str, body: dict, sender: int) -> None:
        """A CHUNK, COMMIT or ABORT of a sender whose capability was not admitted: refused,
        its data swallowed; the transfer goes on."""
        self.rejected["unauthorized"] += 1
        if kind == wire.CHUNK:
            self._swallow_body(body)
            self._reply(tid, wire.ERROR, {"reason": UNAUTHORIZED}, to=sender)
        elif kind == wire.COMMIT:
            self._reply(tid, wire.VERDICT, {"published": False, "reason": UNAUTHORIZED}, to=sender)

    def _after_end(self, inb: Inbound, msg: wire.Received, obj: dict | None = None) -> None:
        """The genuine sender's message for a transfer that ended: it hears so at once."""
        self.rejected["ended"] += 1
        if obj is None and not msg.oob_tag:
            try:
                obj = msg.body()
            except wire.ProtocolError:
                obj = {}
        obj = obj or {}
        if msg.kind == wire.AUTH and msg.sender not in inb.replies:
            self._tasks.spawn(self._reply_then(inb, msg.sender, msg.transfer_id, obj.get("reply")))
            return
        self._answer_ended(inb, msg.kind, msg.sender, msg.transfer_id, obj)

    async def _reply_then(self, inb: Inbound, sender: int, tid: str, reply) -> None:
        if await self._reply_to(inb, sender, reply):
            self._answer_ended(inb, wire.AUTH, sender, tid, {})

    def _answer_ended(self, inb: Inbound, kind: int, sender: int, tid: str, obj: dict) -> None:
        reason = f"transfer {tid} not expected (it ended: {inb.ended[:200]})"
        if kind == wire.CHUNK:
            self._swallow_body(obj)
        if kind == wire.COMMIT:
            self._reply(tid, wire.VERDICT, {"published": False, "reason": reason}, to=sender)
        elif kind != wire.ABORT:
            self._reply(tid, wire.ERROR, {"reason": reason}, to=sender)

    def _swallow_body(self, body: dict) -> None:
        """A refused CHUNK's data off the wire (its tags and count from its authenticated header)."""
        try:
            first, sizes = int(body["tag"]), body["sizes"]
            if wire.tag_parts(first)[0] == wire.DATA and type(sizes) is list:
                self._swallow(first, min(len(sizes), self.MAX_PIECES))
        except (KeyError, TypeError, ValueError):
            pass

    def _reply(self, tid: str, kind: int, body: dict, to: int = 0) -> None:
        """Post a reply now (in order with earlier replies) to the sender mailbox `to` (0: the
        one admitted), under the transfer's key; errors are only logged: a sender that hears
        nothing times out."""
        inb = self._in.get(tid)
        mailbox = to or (inb.admitted if inb is not None else 0)
        ep = inb.replies.get(mailbox) if inb is not None else None
        if ep is None:
            return
        try:
            futs = post_control(self._rt, ep, wire.tag(wire.REPLY, mailbox), kind, tid, self.nonce, next(self._seq),
                                body, inb.key, TO_SENDER)
        except Exception as e:  # noqa: BLE001 - UCX refused the post
            log.warning("ucx receiver: reply %s for %s not posted: %r", wire.KIND_NAMES.get(kind), tid, e)
            return
        for f in futs:
            f.add_done_callback(_log_reply_error)


def _log_reply_error(f: asyncio.Future) -> None:
    if not f.cancelled() and f.exception() is not None:
        log.info("ucx receiver: a reply was not delivered: %r", f.exception())
