"""The UCX sender's exchange with a receiver under each transfer's key: the AUTH that opens
a transfer (`present`: its capability, and where replies go), every control message posted
under the key (`_control`, `_post_control`), and the replies, each taken only if its MAC
holds under the transfer's key and its seq is new (`_on_reply`; else dropped and counted,
pd_dataplane_rejected_total). A mixin of `UcxSender`: it uses the sender's `_rt`, `nonce`,
`_keys`, `_outs`, `_seq`, `rejected`, `io_timeout_s`, `_peer`, `_fail`, `_drop_peer` and
`_release`."""

from __future__ import annotations

import asyncio

from ..base import TransferError, Verdict
from ..keys import TO_RECEIVER, TransferKey
from . import wire
from .mailbox import delivered, post_control
from .outgoing import Outgoing, Peer, wait_progress


class SenderExchange:
    """What a UcxSender sends and takes under each transfer's key."""

    async def present(self, dest: str, transfer_id: str, credential: dict | None, key: bytes = b"",
                      confirm: bool = False) -> None:
        """AUTH: the credential and where replies go, under the transfer's key; every later
        message of the transfer is sent under that key too (none given: the public one)."""
        peer = await self._peer(dest)
        keyed = self._keys.add(transfer_id, TransferKey.of(transfer_id, key))
        out = self._out(peer, transfer_id)
        out.raise_if_failed()
        body = {**(credential or {}), "reply": {"address": wire.b64(self._rt.address)}}
        if confirm:
            body["confirm"] = True
            keyed.admitted = asyncio.get_running_loop().create_future()
        try:
            await self._control(out, wire.AUTH, body)
        except Exception as e:  # noqa: BLE001 - any UCX error
            self._fail(out, f"AUTH to {wire.peer_name(dest)} failed: {e!r}")
        out.raise_if_failed()
        if confirm and not await wait_progress(out, keyed.admitted, self.io_timeout_s, self._rt, self._drop_peer):
            self._fail(out, out.failed or f"AUTH of {transfer_id} not answered in {self.io_timeout_s} s")
        out.raise_if_failed()

    def _out(self, peer: Peer, transfer_id: str) -> Outgoing:
        """The outgoing state of `transfer_id` to `peer`, made on first use (after `present`)."""
        out = self._outs.get(transfer_id)
        if out is None or out.peer.dest != peer.dest:
            keyed = self._keys.get(transfer_id)
            if keyed is None:
                raise TransferError(f"transfer {transfer_id}: not presented (`present` gives its key and "
                                    "tells the receiver where to reply)")
            if out is not None:
                raise TransferError(f"transfer {transfer_id} is under way to {wire.peer_name(out.peer.dest)}")
            out = self._outs[transfer_id] = Outgoing(peer, transfer_id, keyed)
        return out

    async def _control(self, out: Outgoing, kind: int, body: dict) -> None:
        """One control message of `out`'s transfer, sent (io_timeout_s)."""
        await delivered(self._rt, self._post_control(out, kind, body), f"{wire.KIND_NAMES[kind]} for {out.tid}",
                        self.io_timeout_s)

    def _post_control(self, out: Outgoing, kind: int, body: dict) -> list[asyncio.Future]:
        k = out.keyed
        return post_control(self._rt, out.peer.ep, wire.tag(wire.CTRL, out.peer.nonce), kind, out.tid, self.nonce,
                            next(self._seq), body, k.key, TO_RECEIVER, lambda: k.tags(wire.BODY, 1))

    # -- replies (mailbox, in arrival order): each under its transfer's key, or dropped
    def _on_reply(self, msg: wire.Received) -> None:
        keyed = self._keys.get(msg.transfer_id)
        why = "unknown_transfer" if keyed is None else keyed.accept(msg)
        if not why and msg.oob_tag:
            why = "oversized"  # a reply always travels inline
        try:
            body = {} if why else msg.body()
        except wire.ProtocolError:
            why = "malformed"
        if why:
            self.rejected[why] += 1
            return
        if keyed.admitted is not None and not keyed.admitted.done() and msg.kind in (wire.ADMITTED, wire.ERROR):
            keyed.admitted.set_result(msg.kind == wire.ADMITTED)
        out = self._outs.get(msg.transfer_id)
        if out is None:
            return  # settled: nothing to do
        kind = msg.kind
        if kind == wire.VISIBLE:
            serials = body.get("serials")
            for serial in serials if isinstance(serials, list) else ():
                c = out.chunks.get(serial)
                if c is not None and c.state == "sending":
                    c.state = "visible"
                    self._release(out.peer, c, count=True)
            out.changed.set()
        elif kind == wire.ERROR:
            self._fail(out, str(body.get("reason", "rejected"))[:4096])
        elif kind == wire.VERDICT:
            if out.verdict is not None and not out.verdict.done():
                out.verdict.set_result(Verdict(bool(body.get("published")), str(body.get("reason", ""))[:4096]))
