"""The UCX sender's byte credit per destination (a `CreditWindow` per peer): taken per
message before its header is posted, returned when the receiver says the message is in
place (VISIBLE), with the VERDICT for the message that let the COMMIT through, or, after a
failure, once UCX can no longer touch the message's memory (its sends completed, or the
peer's endpoint dropped after `fence_timeout_s`). A mixin of `UcxSender`: it uses the
sender's `_fail`, `_drop_peer`, `io_timeout_s`, `fence_timeout_s` and `stats`."""

from __future__ import annotations

import asyncio

from ..base import Verdict
from ..credits import CreditTimeout
from .outgoing import OutChunk, Outgoing, Peer


class SenderCredits:
    """Credit taken and given back by a UcxSender."""

    async def _credit(self, out: Outgoing, nbytes: int) -> None:
        """Take `nbytes` of the peer's credit window for one message (TransferError if stuck)."""
        peer = out.peer
        out.raise_if_failed()
        try:
            await peer.credits.acquire(nbytes, self.io_timeout_s)
        except CreditTimeout as e:
            self._fail(out, f"credit window to {peer.dest} stuck: {e}")
            out.raise_if_failed()
        if out.failed:  # failed while we waited: the credit goes straight back
            peer.credits.release(nbytes)
            out.raise_if_failed()

    async def _fence_unseen(self, out: Outgoing, verdict: Verdict) -> None:
        """After a verdict, the chunks never VISIBLE return their credit: at once when UCX is
        done with all their sends (the last chunk before a COMMIT gets no VISIBLE: a
        published verdict says it landed), else once fenced (refused first)."""
        fence = []
        for c in [c for c in out.chunks.values() if c.credited and c.state != "visible"]:
            if not all(f.done() and not f.cancelled() and f.exception() is None for f in c.sends):
                fence.append(c)
                continue
            c.state = "visible" if verdict.published else "fenced"
            self._release(out.peer, c, count=verdict.published)
        await asyncio.gather(*(self._fence(out, c) for c in fence))

    async def _fence(self, out: Outgoing, c: OutChunk) -> None:
        """Return a failed chunk's credit once UCX can no longer touch its memory."""
        if c.sends:
            _, pending = await asyncio.wait(c.sends, timeout=self.fence_timeout_s)
            if pending:
                self._drop_peer(out.peer, f"{len(pending)} sends of {out.tid} unfinished "
                                          f"{self.fence_timeout_s} s after the failure")
        c.state = "fenced"
        self._release(out.peer, c)

    def _release(self, peer: Peer, c: OutChunk, count: bool = False) -> None:
        """Its credit back; `count`: it was delivered (sender stats)."""
        if c.credited:
            c.credited = False
            peer.credits.release(c.nbytes)
            if count:
                self.stats["chunks"] += 1
                self.stats["bytes"] += c.nbytes
