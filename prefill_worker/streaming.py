"""Layer-wise streaming of a prefill's K/V: the producer gate (docs/design.md, Contracts:
the streaming gate).

The engine thread reports `on_layer(layer, token_start, token_end)` after it
wrote a layer's K/V for a prefill chunk. `ProducerGate` turns those reports into
per-layer high-water marks on the event loop; `stream_chunks` sends each chunk
of the transfer plan as soon as its gate opens:

    chunk (layer, blocks [b0, b1)) may be sent  <=>  produced[layer] >= min(b1 * bs, prompt_len)

Tokens reused from the prefix cache (before `reused`) count as produced for
every layer from the start. Chunks of different layers are sent in the order
their gates open (a prefill chunk produces layer 0..L-1 of its blocks, so
layer-major plan order would wait needlessly).

Safety invariant: a chunk's bytes are read (checksum, send) only after its gate
opened, and the engine never rewrites a (layer, token) it reported written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from runtime.transfer import ChunkKey


class ProducerGate:
    """Per-layer produced-token high-water marks, fed from the engine thread."""

    def __init__(self, num_layers: int, reused_tokens: int, prompt_tokens: int,
                 loop: asyncio.AbstractEventLoop, on_written: Callable | None = None):
        self.produced = [reused_tokens] * num_layers
        self.prompt_tokens = prompt_tokens
        self.changed = asyncio.Event()
        self.failed: BaseException | None = None
        self._loop = loop
        self._on_written = on_written

    def on_layer(self, layer: int, token_start: int, token_end: int) -> None:
        """Engine thread: layer's K/V for [token_start, token_end) is in the cache."""
        self._loop.call_soon_threadsafe(self._written, layer, token_end)

    def _written(self, layer: int, token_end: int) -> None:
        if token_end > self.produced[layer]:
            self.produced[layer] = token_end
        if self._on_written is not None:
            self._on_written(layer, token_end)
        self.changed.set()

    def fail(self, error: BaseException) -> None:
        """The computation ended without producing everything."""
        self.failed = error
        self.changed.set()

    def ready(self, key: ChunkKey, block_size: int) -> bool:
        need = min((key.block_start + key.block_count) * block_size, self.prompt_tokens)
        return self.produced[key.layer] >= need


async def stream_chunks(gate: ProducerGate, plan: list[ChunkKey], block_size: int,
                        send: Callable[[ChunkKey], Awaitable[None]],
                        check: Callable[[], None]) -> None:
    """Send every key of `plan` once its gate opens; returns after the last send.

    `check` raises to stop (cancel); a gate failure is raised as is.
    """
    per_layer: dict[int, list[ChunkKey]] = {}
    for key in plan:
        per_layer.setdefault(key.layer, []).append(key)
    for keys in per_layer.values():
        keys.sort(key=lambda k: k.block_start)
    nxt = {layer: 0 for layer in per_layer}
    left = len(plan)
    while left:
        gate.changed.clear()
        progressed = False
        for layer, keys in per_layer.items():
            while nxt[layer] < len(keys) and gate.ready(keys[nxt[layer]], block_size):
                check()
                await send(keys[nxt[layer]])
                nxt[layer] += 1
                left -= 1
                progressed = True
        if left and not progressed:
            if gate.failed is not None:
                raise gate.failed
            await gate.changed.wait()
