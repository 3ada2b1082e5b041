"""The K/V digest built while layers become final, so that little is left to hash when the
last one is (docs/design.md, Contracts: the whole-prompt digest after the last chunk cost
20-30 ms on each side of a 2,048-token hand-off).

    digest = LayerDigest(engine, seq)
    digest.final(layer)        # as each layer's K/V is complete (any order)
    digest.hexdigest()         # == engine.kv_digest(seq)

Layers are hashed in order, each once, as soon as every layer before them is final too.
The caller keeps the calls sequential (one thread at a time) and never writes a layer it
called final; the value is `Engine.kv_digest`'s by construction (same hasher, same order).
"""

from __future__ import annotations

from .engine import Engine
from .sequence import Sequence


class LayerDigest:
    """Engine.kv_digest of `seq`'s first `num_tokens` (default: the prompt), layer by layer."""

    def __init__(self, engine: Engine, seq: Sequence, num_tokens: int | None = None):
        self._engine = engine
        self._state = engine.kv_digest_start(seq, num_tokens)
        self._final = [False] * engine.num_layers
        self.hashed = 0
        """Layers hashed so far (a prefix of the model's layers)."""

    def final(self, layer: int) -> None:
        """`layer`'s K/V will not change: hash it, and every final layer after it, once
        each layer before it is hashed."""
        self._final[layer] = True
        while self.hashed < len(self._final) and self._final[self.hashed]:
            self._engine.kv_digest_layer(self._state, self.hashed)
            self.hashed += 1

    def hexdigest(self) -> str:
        """The digest, hashing the layers left (all of them are final by now)."""
        for layer in range(self.hashed, len(self._final)):
            self.final(layer)
        return self._state[0].hexdigest()
