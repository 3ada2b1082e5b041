"""The UCX sender's records: a destination it talks to (`Peer`), one outgoing transfer
(`Outgoing`) and one message of chunks in it (`OutChunk`: one chunk, or a batch of small
ones); and whether a peer on this host still runs (`alive`)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

from services.common.liveness import process_running

from .base import ChunkKey, TransferError
from .credits import CreditWindow


@dataclasses.dataclass(eq=False)
class OutChunk:
    serial: int
    key: ChunkKey
    nbytes: int
    views: list[memoryview]
    head: dict = dataclasses.field(default_factory=dict)  # its CHUNK body, less serial, sizes and tag
    packed: bool = False
    """A batch: `views` are its chunks' views until posted, then the one buffer they are packed into."""
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
    held: OutChunk | None = None
    """The last batch of a `send_many(hold_last=True)`: issued (credited), it leaves with the
    COMMIT, which rides in its header (or before the next chunk, if one comes first)."""

    def raise_if_failed(self) -> None:
        if self.failed:
            raise TransferError(f"transfer {self.tid} to {self.peer.dest[:60]}: {self.failed}")

    async def settle(self) -> None:
        """Wait for the failed transfer's fences (bounded: they time out themselves)."""
        while self.fences:
            fences, self.fences = self.fences, []
            await asyncio.gather(*fences, return_exceptions=True)


def sender_metrics(stats: dict, peers) -> list[tuple[str, dict, float]]:
    """A UcxSender's samples for services.telemetry: totals, and per destination (`peers`) its
    path and credit."""
    out = [(f"pd_transfer_sent_{k}_total", {"backend": "ucx"}, v) for k, v in stats.items()]
    for p in peers:
        peer = {"backend": "ucx", "peer": f"{p.nonce:x}@{p.host}", "path": p.path}
        out += [("pd_transfer_path_info", peer, 1),
                ("pd_transfer_credit_in_flight_bytes", peer, p.credits.in_flight),
                ("pd_transfer_credit_peak_bytes", peer, p.credits.peak),
                ("pd_transfer_credit_window_bytes", peer, p.credits.capacity)]
    return out


def alive(host: str, pid: int, rt) -> bool:
    """False only when the peer runs on this host (`rt.host`, rt a UcxRuntime) and its
    process is gone."""
    if rt is None or host != rt.host or pid <= 0:
        return True
    return process_running(pid)
