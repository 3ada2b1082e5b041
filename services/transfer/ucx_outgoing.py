"""The UCX sender's records: a destination it talks to (`Peer`), one outgoing transfer
(`Outgoing`) and one message of chunks in it (`OutChunk`: one chunk, or a batch of small
ones); and whether a peer on this host still runs (`alive`)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

from services.common.liveness import process_running

from .base import ChunkKey
from .credits import CreditWindow


@dataclasses.dataclass(eq=False)
class OutChunk:
    serial: int
    key: ChunkKey
    nbytes: int
    views: list[memoryview]
    state: str = "issued"  # issued -> sending (header and data posted) -> visible | fenced
    sends: list[asyncio.Future] = dataclasses.field(default_factory=list)
    credited: bool = True


@dataclasses.dataclass(eq=False)
class Peer:
    dest: str
    nonce: int
    host: str
    pid: int
    address: bytes
    ep: object
    credits: CreditWindow
    path: str
    dead: str = ""


@dataclasses.dataclass(eq=False)
class Outgoing:
    peer: Peer
    tid: str
    chunks: dict[int, OutChunk] = dataclasses.field(default_factory=dict)
    failed: str = ""
    verdict: asyncio.Future | None = None
    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    fences: list[asyncio.Task] = dataclasses.field(default_factory=list)
    serials: itertools.count = dataclasses.field(default_factory=itertools.count)


def alive(host: str, pid: int, rt) -> bool:
    """False only when the peer runs on this host (`rt.host`, rt a UcxRuntime) and its
    process is gone."""
    if rt is None or host != rt.host or pid <= 0:
        return True
    return process_running(pid)
