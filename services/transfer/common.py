"""Receiver-side rules shared by the backends: where a chunk goes, and event delivery."""

from __future__ import annotations

import logging

from .base import ChunkKey, Expectation

log = logging.getLogger(__name__)


def byte_view(buf) -> memoryview:
    """buf as a flat view of bytes (the unit of payload lengths and checksums)."""
    v = memoryview(buf)
    return v if v.format == "B" and v.ndim == 1 else v.cast("B")


def destination(exp: Expectation, key: ChunkKey, payload_len: int
                ) -> tuple[list[memoryview], str]:
    """(views, '') to write `key` into, or ([], why the chunk is rejected)."""
    if key in exp.received:
        return [], f"duplicate chunk {key}"
    try:
        views = [byte_view(v) for v in exp.resolve(key)]
    except Exception as e:  # noqa: BLE001 - KeyError by contract; range errors from the engine
        return [], f"unexpected chunk {key}: {e!r}"
    if any(v.readonly for v in views):
        return [], f"chunk {key} resolves to read-only memory"
    size = sum(v.nbytes for v in views)
    if size != payload_len:
        return [], f"chunk {key} is {payload_len} bytes, expected {size}"
    return views, ""


def emit(exp: Expectation, event: object) -> None:
    """Deliver an event to the expectation's listener; a listener's bug is logged, not raised."""
    try:
        exp.on_event(event)
    except Exception:  # noqa: BLE001 - a listener's bug must not break the transport
        log.exception("on_event of %s raised", exp.transfer_id)


def cut_points(*size_lists: list[int]) -> list[int]:
    """Union of the cumulative boundaries of several partitions of the same byte range.

    Each list partitions one total into contiguous pieces (a side's views); the
    result, ending with the total, splits the range so that every segment lies
    inside one piece of every list. ValueError if the totals differ.
    """
    totals = {sum(s) for s in size_lists}
    if len(totals) != 1:
        raise ValueError(f"partitions of different totals: {sorted(totals)}")
    cuts = set()
    for sizes in size_lists:
        off = 0
        for n in sizes:
            off += n
            cuts.add(off)
    cuts.discard(0)
    return sorted(cuts)


def segments(views: list[memoryview], cuts: list[int]) -> list[memoryview]:
    """Slice views (a partition of one range) at `cuts` (from cut_points over them)."""
    out: list[memoryview] = []
    starts, off = [], 0
    for v in views:
        starts.append(off)
        off += v.nbytes
    i, prev = 0, 0
    for cut in cuts:
        while starts[i] + views[i].nbytes <= prev:
            i += 1
        lo, hi = prev - starts[i], cut - starts[i]
        if hi > views[i].nbytes:
            raise ValueError(f"cut {cut} crosses a view boundary")
        out.append(views[i][lo:hi])
        prev = cut
    return out
