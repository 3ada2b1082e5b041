"""The expected chunk list of a hand-off: the transfer set cut into chunks.

The destination plans it when it reserves (it knows which leading blocks it
already holds); the router copies it into the manifest; the source sends those
chunks and no others; the destination validates what arrived against it, and
the directory refuses VALIDATED unless the destination's list has the same
layout (``records.chunk_list_digest``). Pure functions: every party checks a
list it was given with ``tiling_error`` before trusting it.
"""

from __future__ import annotations

from collections.abc import Iterable

Layout = tuple[int, int, int, int]
"""(layer, block_start, block_count, num_bytes) of one chunk."""


def tiling_error(chunks: Iterable[Layout], first_block: int, last_block: int,
                 num_layers: int | None = None) -> str:
    """Why ``chunks`` is not a transfer set, or '' when it is one.

    A transfer set covers, for every layer 0..L-1 (L = ``num_layers``, or the
    layers the list names, which must then be contiguous from 0), the logical
    blocks [first_block, last_block) exactly once, each chunk non-empty with
    bytes in proportion to its blocks. An empty block range needs an empty list.
    """
    per_layer: dict[int, list[tuple[int, int]]] = {}
    bytes_per_block: set[float] = set()
    for layer, start, count, nbytes in chunks:
        if layer < 0 or count <= 0 or start < 0 or nbytes <= 0:
            return f"chunk (layer {layer}, blocks {start}+{count}, {nbytes} B) is empty or negative"
        per_layer.setdefault(layer, []).append((start, count))
        bytes_per_block.add(nbytes / count)
    if last_block <= first_block:
        return "" if not per_layer else f"{len(per_layer)} layers of chunks for an empty block range"
    if not per_layer:
        return f"no chunks for blocks [{first_block}, {last_block})"
    layers = num_layers if num_layers is not None else len(per_layer)
    if sorted(per_layer) != list(range(layers)):
        return f"chunks name layers {sorted(per_layer)[:8]}, expected 0..{layers - 1}"
    if len(bytes_per_block) > 1:
        return "chunks carry different bytes per block"
    for layer, runs in per_layer.items():
        at = first_block
        for start, count in sorted(runs):
            if start != at:
                return f"layer {layer}: blocks from {at} are {'missing' if start > at else 'listed twice'}"
            at = start + count
        if at != last_block:
            return f"layer {layer}: chunks end at block {at}, the transfer set at {last_block}"
    return ""
