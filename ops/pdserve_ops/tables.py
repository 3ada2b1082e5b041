"""Plain-text tables for pdctl's listings, and the K/V pool's columns they share."""

from __future__ import annotations

from collections.abc import Sequence

POOL_HEADERS = ("FREE", "(CACHED)", "RESERVED", "ACTIVE", "TOTAL")
"""A worker's K/V pool as `pdctl status` and `pdctl blocks` both print it (pool_cells)."""
POOL_HELP = ("FREE: blocks a new request can take now; (CACHED): the part of FREE still holding a "
             "reusable prompt prefix; RESERVED: held for hand-offs not yet published; ACTIVE: held by "
             "running prefills and decodes. FREE + RESERVED + ACTIVE = TOTAL.")
"""What the pool columns mean: one definition, the load reports' (docs/observability.md, Blocks)."""


def pool_cells(*, free: int, cached: int, reserved: int, active: int, total: int) -> tuple[int, ...]:
    """The POOL_HEADERS cells of one worker, in their order; `free` counts its `cached` blocks too."""
    return free, cached, reserved, active, total


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns, two spaces apart, one line per row under a header line."""
    cells = [list(map(str, headers))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)
