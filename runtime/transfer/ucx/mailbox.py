"""Control messages over UCX: a `Mailbox` receiving them on one tag, and posting
authenticated ones (`post_control`, then `delivered` to wait for them; wire.py has the
format).

The mailbox parses each message and hands it to its owner (the receiver or the sender)
before anything of it is trusted: the owner checks its MAC under the transfer's key and
drops it, counted, if that fails. The mailbox never waits for a peer: an out-of-line body
is the owner's to take (after the head's MAC held), and the only thing it awaits is what
the owner's handler returns, which the owner keeps to local work.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable

from ..keys import TransferKey
from . import wire
from .runtime import UcxRuntime

log = logging.getLogger(f"{__package__}.ucx")

RING = 64
"""Control buffers a mailbox keeps posted."""
STOP_WAIT_S = 5.0

Handler = Callable[[wire.Received], Awaitable[None] | None]


class Mailbox:
    """Receives control messages on one tag and hands them, parsed, in arrival order, to
    `handler`, which runs on the event loop and must not block: what it returns (local
    work only, never a wait for a peer) is awaited before the next message. A message
    that breaks the format, or is larger than the buffers, is dropped: `on_reject(reason)`."""

    def __init__(self, rt: UcxRuntime, tag: int, handler: Handler, name: str,
                 on_reject: Callable[[str], None] = lambda _reason: None):
        self.rt, self.tag, self.handler, self.name, self.on_reject = rt, tag, handler, name, on_reject
        self._task: asyncio.Task | None = None
        self._stopping = False

    def start(self) -> None:
        kind, bits, _ = wire.tag_parts(self.tag)
        self.rt.expect_tags(kind, bits)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._stopping = True
        ep = await self.rt.endpoint(self.rt.address)
        await asyncio.wait([self.rt.post_send(ep, wire.encode_stop(), self.tag)], timeout=STOP_WAIT_S)
        try:
            async with asyncio.timeout(STOP_WAIT_S):
                await asyncio.shield(self._task)
        except (TimeoutError, asyncio.CancelledError):
            self._task.cancel()
        self._task = None
        kind, bits, _ = wire.tag_parts(self.tag)
        self.rt.expect_tags(kind, bits, -1)

    async def _run(self) -> None:
        # A ring of posted buffers: UCX matches messages of one tag to posted
        # receives in posting order, so a burst lands in one wake-up, in order.
        ring = collections.deque()
        for _ in range(RING):
            buf = bytearray(wire.MESSAGE_BUFFER_BYTES)
            ring.append((buf, self.rt.post_recv(buf, self.tag)))
        while True:
            buf, fut = ring.popleft()
            msg = None
            try:
                await fut
                msg = wire.decode(memoryview(buf))  # copies what it keeps: the buffer is posted again
            except asyncio.CancelledError:
                raise
            except wire.ProtocolError as e:
                log.debug("%s: dropped a control message: %s", self.name, e)
                self.on_reject("malformed")
            except Exception as e:  # noqa: BLE001 - e.g. a message larger than the buffer (truncated)
                log.debug("%s: dropped a message that could not be received: %r", self.name, e)
                self.on_reject("oversized")
            finally:
                ring.append((buf, self.rt.post_recv(buf, self.tag)))
            if msg is None:
                continue
            if msg.kind == wire.STOP:
                if self._stopping:
                    return
                self.on_reject("malformed")
                continue
            try:
                res = self.handler(msg)
                if res is not None:
                    await res
            except Exception:  # one bad message must not stop the mailbox
                log.exception("%s: handler of %s failed", self.name, wire.KIND_NAMES.get(msg.kind))


def post_control(rt: UcxRuntime, ep, to_tag: int, kind: int, transfer_id: str, sender: int, seq: int,
                 obj: dict | None, key: TransferKey, direction: bytes, body_tag: Callable[[], int] | None = None
                 ) -> list[asyncio.Future]:
    """Post one authenticated control message (its body out of line on `body_tag()` when
    large); its send futures.

    Messages posted on one endpoint and tag are matched in posting order, so a
    caller that does not wait still keeps the protocol's order.
    """
    msg, body, oob = wire.encode(kind, transfer_id, sender, seq, obj, key, direction, body_tag)
    if not body:
        return [rt.post_send(ep, msg, to_tag)]
    return [rt.post_send(ep, msg, to_tag), rt.post_send(ep, body, oob)]


async def delivered(rt: UcxRuntime, futs: list[asyncio.Future], what: str, timeout_s: float) -> None:
    """Wait (timeout_s) until UCX is done with `futs`, the sends of one control message
    (`what`, for the error; `post_control`'s). The worker is progressed at once: the message
    leaves now, not after the loop's other ready callbacks (the token's COMMIT waited
    0.15-0.5 ms for them behind the prefill's wake-up)."""
    rt.progress()
    done, pending = await asyncio.wait(futs, timeout=timeout_s)  # never cancels ucxx's futures
    if pending:
        raise TimeoutError(f"{what} not delivered in {timeout_s} s")
    for f in done:
        f.result()
