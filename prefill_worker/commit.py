"""The prefill's COMMIT and what travels beside it: the capability and the chunks announced
ahead of it (`present`), settling side futures, and the token's COMMIT sent from token 0's
own loop callback when the transfer was committed ahead of it (`TokenCommit`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from runtime.transfer import ChunkKey, KVSender, Verdict


async def present(sender: KVSender, dest: str, transfer_id: str, credential: dict | None, key: bytes,
                  keys: list[tuple[ChunkKey, int]]) -> None:
    """Open the transfer at the destination: its capability (none: security off) and its key
    (the grant's), then announce `keys` (the chunks of a transfer sent whole once computed:
    the destination makes their memory ready while this computes). Nothing of the transfer
    may leave before this is done."""
    await sender.present(dest, transfer_id, credential, key)
    if keys:
        await sender.announce(dest, transfer_id, keys)


async def settle(fut: asyncio.Future | None) -> None:
    """Cancel `fut` unless done, and wait for it (its error, if any, was raised elsewhere).
    A done one costs no turn of the loop (the token's way passes here)."""
    if fut is None:
        return
    if fut.done():
        if not fut.cancelled():
            fut.exception()  # retrieved
        return
    fut.cancel()
    await asyncio.gather(fut, return_exceptions=True)


class TokenCommit:
    """Streamed and committed ahead (TOKEN_FOLLOWS), the token's COMMIT is all that is left
    once the compute ends. Armed with `send(token)` (the COMMIT) as soon as the destination
    published, it posts that COMMIT from token 0's
    own loop callback (`AsyncSink(on_first=...)`): not after the prefill's coroutine wakes,
    walks its bookkeeping and opens a live span. Measured on the token's way (T_exposed,
    2,048 tokens, `small`): 0.35-0.7 ms from the compute's end to the COMMIT's post, most
    of it Python running cold after the compute; bench/results/transfer.md.

    Not armed, or token 0 came first: `sent` stays None and the prefill commits as before."""

    def __init__(self, enabled: bool = True, ready: Callable[[], bool] = lambda: True):
        """enabled: False leaves every COMMIT to the prefill's coroutine; ready(): may the
        token's COMMIT leave now (the prefill not cancelled, its credential sent)?"""
        self.enabled, self.ready = enabled, ready
        self.send: Callable[[int], Awaitable[Verdict]] | None = None
        self.sent: asyncio.Future | None = None
        """The token's COMMIT (its verdict), once posted from the callback."""
        self.sent_ns = 0

    def arm(self, send: Callable[[int], Awaitable[Verdict]]) -> None:
        if self.enabled:
            self.send = send

    def on_first(self, token: int) -> None:
        """Loop thread, token 0 just sampled (before the prefill's coroutine hears of it)."""
        if self.send is not None and self.sent is None and self.ready():
            self.sent_ns = time.time_ns()
            self.sent = asyncio.ensure_future(self.send(token))
