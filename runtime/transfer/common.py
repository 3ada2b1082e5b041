"""Receiver-side rules shared by the backends: where a chunk goes, and event delivery."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from .base import Chunk, ChunkKey, Expectation, Failed, TransferCommit, Verdict, emit

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
    return _writable(exp, key, payload_len)


def destinations(exp: Expectation, chunks: Sequence[Chunk], claimed: set[ChunkKey]
                 ) -> tuple[list[list[memoryview]], str]:
    """The views of each chunk of one message (a packed batch's several), or ([], why the
    message is refused): none claimed (`claimed`: accepted earlier) or landed before, each
    resolving to writable memory of its size."""
    per = []
    for c in chunks:
        if c.key in claimed or c.key in exp.received:
            return [], f"duplicate chunk {c.key}"
        views, problem = _writable(exp, c.key, c.num_bytes)
        if problem:
            return [], problem
        per.append(views)
    return per, ""


def _writable(exp: Expectation, key: ChunkKey, payload_len: int) -> tuple[list[memoryview], str]:
    try:
        views = [byte_view(v) for v in exp.resolve(key)]
    except Exception as e:  # noqa: BLE001 - KeyError by contract; range errors from the engine
        return [], f"unexpected chunk {key}: {e!r}"
    size = 0  # (plain loops: a batch checks dozens of chunks on the hand-off's path)
    for v in views:
        if v.readonly:
            return [], f"chunk {key} resolves to read-only memory"
        size += v.nbytes
    if size != payload_len:
        return [], f"chunk {key} is {payload_len} bytes, expected {size}"
    return views, ""


def place(views: list[memoryview], sizes: list[int]) -> list[list[memoryview]]:
    """Where each of the sender's pieces (sizes, in order) lands in `views`.

    Entry i lists the view slices piece i covers: one slice when the piece lies
    inside one view (receive it there directly), several when it crosses view
    boundaries (receive it into staging, then copy). ValueError if totals differ.
    """
    if sum(sizes) != sum(v.nbytes for v in views):
        raise ValueError(f"pieces of {sum(sizes)} bytes for views of "
                         f"{sum(v.nbytes for v in views)}")
    if len(sizes) == 1:  # one piece (a packed batch): it covers every view, whole
        return [[v for v in views if v.nbytes]]
    out: list[list[memoryview]] = []
    vi, voff = 0, 0
    for n in sizes:
        parts = []
        while n:
            while views[vi].nbytes == voff:
                vi, voff = vi + 1, 0
            take = min(n, views[vi].nbytes - voff)
            parts.append(views[vi][voff:voff + take])
            voff += take
            n -= take
        out.append(parts)
    return out


def scatter(buf, parts: list[memoryview]) -> None:
    """Copy a staging buffer that `place` gave several view slices into those slices, in order."""
    src, off = memoryview(buf), 0
    for part in parts:
        part[:] = src[off:off + part.nbytes]
        off += part.nbytes


async def decide(exp: Expectation, commit: TransferCommit) -> Verdict:
    """Run the expectation's commit handler; its bug becomes a refusal plus Failed."""
    try:
        return await exp.on_commit(commit)
    except asyncio.CancelledError:
        emit(exp, Failed(exp.transfer_id, "receiver stopped during commit"))
        raise
    except Exception as e:  # the handler's bug must not kill the transport
        log.exception("on_commit of %s raised", exp.transfer_id)
        verdict = Verdict(False, f"commit handler failed: {e!r}")
        emit(exp, Failed(exp.transfer_id, verdict.reason))
        return verdict


def pack(views: Sequence[memoryview]) -> memoryview:
    """Small chunks' views back to back in one new buffer, in order (one message)."""
    return memoryview(bytearray().join(views))  # one C copy, no zero fill


def chunk_buffers(chunk: Chunk, buffers: Sequence) -> list[memoryview]:
    """The sender's buffers as byte views; ValueError unless they hold chunk.num_bytes."""
    views, nbytes = [byte_view(b) for b in buffers], 0
    for v in views:
        nbytes += v.nbytes
    if nbytes != chunk.num_bytes:
        raise ValueError(f"chunk {chunk.key} says {chunk.num_bytes} bytes, "
                         f"its buffers hold {nbytes}")
    return views
