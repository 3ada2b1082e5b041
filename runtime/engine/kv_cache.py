"""K/V cache memory: one tensor per layer for K and one for V.

Layout "LKV-BSHD": a single allocation `kv: [L, 2, num_blocks, block_size,
n_kv_heads, head_dim]`; `k[l]` and `v[l]` are contiguous views
`[num_blocks, block_size, n_kv_heads, head_dim]`, so a run of consecutive
physical blocks of one layer is one contiguous byte range — what a transport
sends from and receives into without copying.
"""

from __future__ import annotations

import torch

LAYOUT = "LKV-BSHD"


def slot(block_table: list[int], pos: int, block_size: int) -> int:
    """Flat cache slot of token position `pos` of a sequence with this block table."""
    return block_table[pos // block_size] * block_size + pos % block_size


class KVCache:
    """Paged K/V memory (no bookkeeping: that is `BlockManager`'s job)."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int, dtype: torch.dtype):
        # Zero-filled, never `empty`: masked attention slots multiply their
        # values by exactly 0, which needs them finite (NaN * 0 = NaN).
        self.kv = torch.zeros(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim,
                              dtype=dtype)
        self.k = [self.kv[i, 0] for i in range(num_layers)]
        self.v = [self.kv[i, 1] for i in range(num_layers)]
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._bytes: memoryview | None = None  # the whole cache as bytes, made on first use
        self._half_block_bytes = self.k[0][0].numel() * self.kv.element_size()  # K (or V) of a block

    @property
    def block_bytes_per_layer(self) -> int:
        """Bytes of one block of one layer, K plus V."""
        return 2 * self._half_block_bytes

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v: [T, Hkv, D] at flat slots [T] (slot = block * block_size + offset)."""
        nb, bs, hk, d = self.k[layer].shape
        self.k[layer].view(nb * bs, hk, d).index_copy_(0, slots, k)
        self.v[layer].view(nb * bs, hk, d).index_copy_(0, slots, v)

    def byte_views(self, layer: int, first_block: int, count: int) -> tuple[memoryview, memoryview]:
        """The bytes of physical blocks [first_block, first_block + count) of `layer`, K then
        V, as views of the cache memory (what a transport sends from and receives into).
        Slices of one view of the whole cache made once: ~0.3 µs, against ~5 µs for a tensor
        view made into a memoryview."""
        if not (0 <= layer < len(self.k) and 0 <= first_block and count >= 0
                and first_block + count <= self.num_blocks):
            raise IndexError(f"blocks [{first_block}, {first_block + count}) of layer {layer} "
                             f"outside the cache ({len(self.k)} layers x {self.num_blocks} blocks)")
        if self._bytes is None:
            self._bytes = memoryview(self.kv.view(torch.uint8).numpy()).cast("B")
        per = self._half_block_bytes
        k = (2 * layer * self.num_blocks + first_block) * per
        v = k + self.num_blocks * per
        return self._bytes[k:k + count * per], self._bytes[v:v + count * per]
