"""Chunking a sequence's K/V for transfer, on top of the engine's cache views.

A transfer set is the logical prompt blocks [first_block, last_block) that the
destination lacks. It is cut per layer into chunks of at most
`max_chunk_blocks` blocks; each chunk's bytes are the K then V bytes of its
blocks, which both sides map to views of their own cache memory.
"""

from __future__ import annotations

from runtime.engine import Engine, Sequence

from .base import Chunk, ChunkKey, chunk_checksum
from .keys import TransferKey


def plan_chunks(num_layers: int, first_block: int, last_block: int,
                max_chunk_blocks: int) -> list[ChunkKey]:
    """Chunk keys covering layers x blocks [first_block, last_block), layer-major."""
    assert 0 <= first_block <= last_block and max_chunk_blocks > 0
    return [ChunkKey(layer, b, min(max_chunk_blocks, last_block - b))
            for layer in range(num_layers)
            for b in range(first_block, last_block, max_chunk_blocks)]


def chunk_views(engine: Engine, seq: Sequence, key: ChunkKey) -> list[memoryview]:
    """Views of `seq`'s cache memory holding `key`'s bytes: K runs, then V runs (no copy)."""
    runs = engine.kv_views(seq, key.layer, key.block_start, key.block_count)
    return [k for k, _ in runs] + [v for _, v in runs if v.nbytes]  # an engine whose K and V interleave: V empty


def chunk_bytes(engine: Engine, key: ChunkKey) -> int:
    """Size of a chunk in bytes."""
    return key.block_count * engine.block_bytes_per_layer


def describe_chunk(engine: Engine, seq: Sequence, key: ChunkKey, tkey: TransferKey) -> Chunk:
    """The manifest entry of a chunk, with its checksum computed from the cache under the
    transfer's key."""
    views = chunk_views(engine, seq, key)
    return Chunk(key, sum(v.nbytes for v in views), chunk_checksum(tkey, key, views))
