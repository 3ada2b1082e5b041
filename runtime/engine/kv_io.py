"""K/V export and import of a sequence's blocks.

A sequence's blocks are addressed by logical index (position in its block
table). Physical blocks of one layer are contiguous in memory when their ids are
consecutive, so `block_runs` splits a logical range into runs of consecutive
physical ids and `kv_byte_views` returns, per run, the K and V bytes as views of the
cache memory itself: a transport sends from them and receives into them with no copy.

The packed form (`export_kv`/`import_kv`) is for tests and simple transports:
for each layer, the K bytes of the blocks in logical order, then the V bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .engine import Engine, physical_runs
from .errors import InvalidRequest
from .sequence import Sequence


@dataclass(frozen=True, slots=True)
class BlockRun:
    """Logical blocks [logical_start, +count) stored at physical [physical_start, +count)."""

    logical_start: int
    physical_start: int
    count: int


def block_runs(table: list[int], first: int, count: int) -> list[BlockRun]:
    """Split table[first:first+count] into runs of consecutive physical ids."""
    runs, logical = [], first
    for start, n in physical_runs(table, first, count):
        runs.append(BlockRun(logical, start, n))
        logical += n
    return runs


def kv_byte_views(engine: Engine, seq: Sequence, layer: int, first: int = 0,
                  count: int | None = None) -> list[tuple[memoryview, memoryview]]:
    """(K bytes, V bytes) per physical run of `layer`'s logical blocks (Engine.kv_views)."""
    return engine.kv_views(seq, layer, first, count)


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


def commit_import(engine: Engine, seq: Sequence, first_token: int) -> None:
    """Mark the prompt's K/V as present (imported) and continue from `first_token`
    (Engine.commit_import)."""
    engine.commit_import(seq, first_token)
