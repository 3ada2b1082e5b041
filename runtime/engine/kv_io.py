"""Packed K/V export and import of a sequence's blocks, for tests and simple transports:
for each layer, the K bytes of the blocks in logical order, then the V bytes.

Transports send from, and receive into, views of the cache memory itself
(`Engine.kv_views`, one view per run of consecutive physical blocks); the received K/V
becomes the prompt's with `Engine.commit_import` (runtime/worker/engine_contract.py).
"""

from __future__ import annotations

import torch

from .engine import Engine
from .errors import InvalidRequest
from .sequence import Sequence


def export_kv(engine: Engine, seq: Sequence, first: int = 0, count: int | None = None) -> bytes:
    """Packed copy of the K/V of logical blocks [first, first + count) (default: the prompt's)."""
    count = engine.block_range(seq, first, count)
    table = torch.tensor(seq.block_table[first:first + count], dtype=torch.long)
    parts = []
    for layer in range(engine.model_cfg.num_hidden_layers):
        for cache in (engine.cache.k[layer], engine.cache.v[layer]):
            parts.append(cache.index_select(0, table).view(torch.uint8).numpy().tobytes())
    return b"".join(parts)


def import_kv(engine: Engine, seq: Sequence, data: bytes | memoryview, abi_digest: str,
              first: int = 0, count: int | None = None) -> None:
    """Write packed K/V (from `export_kv` of an engine with the same ABI) into seq's blocks."""
    engine.abi.check_compatible(abi_digest)
    count = engine.block_range(seq, first, count)
    per_part = count * engine.cache.block_bytes_per_layer // 2
    expected = 2 * per_part * engine.model_cfg.num_hidden_layers
    if len(data) != expected:
        raise InvalidRequest(f"K/V payload is {len(data)} bytes, expected {expected} "
                             f"for {count} blocks")
    src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    table = torch.tensor(seq.block_table[first:first + count], dtype=torch.long)
    offset = 0
    for layer in range(engine.model_cfg.num_hidden_layers):
        for cache in (engine.cache.k[layer], engine.cache.v[layer]):
            chunk = src[offset:offset + per_part].view(cache.dtype).view(count, *cache.shape[1:])
            cache.index_copy_(0, table, chunk)
            offset += per_part

