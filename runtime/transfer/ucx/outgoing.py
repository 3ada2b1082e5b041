"""The UCX sender's records: a destination it talks to (`Peer`, made by `connect`), a
transfer's key and counters (`Keyed`, from `present` to the transfer's end), one outgoing
transfer (`Outgoing`) and one message of chunks in it (`OutChunk`: one chunk, or a batch of
small ones); and whether a peer on this host still runs (`alive`)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import itertools
import logging
import secrets

from runtime.common.liveness import process_running

from ..base import ChunkKey, TransferError
from ..credits import CreditWindow
from ..keys import TO_SENDER, TransferKey
from . import wire

log = logging.getLogger(f"{__package__}.ucx")

PROBE_INTERVAL_S = 0.25
"""How often a waiting sender checks that a same-host peer process still exists."""


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
    tag: int = 0
    """Its first data tag (set when its header is posted)."""
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


KEYS_MAX = 65536
"""Transfers whose keys a sender keeps at most (the oldest go first; one normally goes at its
final verdict or abort)."""


@dataclasses.dataclass(eq=False, slots=True)
class Keyed:
    """A transfer's key as `present` gave it, and what the sender counts under it."""

    key: TransferKey
    next_counter: int = dataclasses.field(default_factory=lambda: secrets.randbelow(1 << 31))
    """The next DATA/BODY tag counter: a random start, then consecutive (no two pieces of the
    transfer ever share a tag)."""
    last_reply_seq: int = 0
    admitted: asyncio.Future | None = None
    """present(confirm=True): the receiver's ADMITTED (True) or ERROR (TransferError)."""

    def tags(self, kind: int, count: int) -> int:
        """The first of `count` consecutive tags of `kind` under this transfer's tag bits."""
        first = self.next_counter
        if first + count > wire.COUNTER_SPAN:
            raise TransferError(f"transfer {self.key.transfer_id} used up its tag counter")
        self.next_counter += count
        return wire.tag(kind, self.key.tag_bits, first)

    def accept(self, msg: wire.Received) -> str:
        """'' if `msg` is the receiver's next reply for this transfer (its seq taken), else why not."""
        why = msg.check(self.key, TO_SENDER, self.last_reply_seq)
        self.last_reply_seq = self.last_reply_seq if why else msg.seq
        return why


class Keys(collections.OrderedDict):
    """Keyed by transfer id, at most KEYS_MAX (oldest out first)."""

    def add(self, tid: str, key: TransferKey) -> Keyed:
        """The transfer's record: made by its first `present` (a later one keeps it)."""
        k = self.get(tid)
        if k is None:
            k = self[tid] = Keyed(key)
            while len(self) > KEYS_MAX:
                self.popitem(last=False)
        return k


@dataclasses.dataclass(eq=False)
class Outgoing:
    peer: Peer
    tid: str
    keyed: Keyed
    chunks: dict[int, OutChunk] = dataclasses.field(default_factory=dict)
    failed: str = ""
    verdict: asyncio.Future | None = None
    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    fences: list[asyncio.Task] = dataclasses.field(default_factory=list)
    serials: itertools.count = dataclasses.field(default_factory=itertools.count)
    announced: tuple[OutChunk, list] | None = None
    """A batch announced ahead (`UcxSender.announce`): its header posted, the (key, bytes) of
    its chunks; the next `send_many` must bring exactly them."""
    held: OutChunk | None = None
    """The last batch of a `send_many(hold_last=True)`: issued (credited), it leaves with the
    COMMIT, which rides in its header (or before the next chunk, if one comes first)."""

    def raise_if_failed(self) -> None:
        if self.failed:
            raise TransferError(f"transfer {self.tid} to {wire.peer_name(self.peer.dest)}: {self.failed}")

    async def settle(self) -> None:
        """Wait for the failed transfer's fences (bounded: they time out themselves)."""
        while self.fences:
            fences, self.fences = self.fences, []
            await asyncio.gather(*fences, return_exceptions=True)


def announceable(keys, limit: int, chunk_limit: int) -> bool:
    """Can `keys` ((key, bytes) of a transfer's last chunks) leave as one announced batch:
    several chunks, each up to `chunk_limit` (sender.EAGER_CHUNK_BYTES), `limit` bytes in all?"""
    return len(keys) > 1 and all(0 < n <= chunk_limit for _, n in keys) and sum(n for _, n in keys) <= limit


def sender_metrics(stats: dict, peers) -> list[tuple[str, dict, float]]:
    """A UcxSender's samples for runtime.telemetry: totals, and per destination (`peers`) its
    path and credit (the peer named by host and a short hash of its address: no nonce)."""
    out = [(f"pd_transfer_sent_{k}_total", {"backend": "ucx"}, v) for k, v in stats.items()]
    for p in peers:
        peer = {"backend": "ucx", "peer": peer_label(p), "path": p.path}
        out += [("pd_transfer_path_info", peer, 1),
                ("pd_transfer_credit_in_flight_bytes", peer, p.credits.in_flight),
                ("pd_transfer_credit_peak_bytes", peer, p.credits.peak),
                ("pd_transfer_credit_window_bytes", peer, p.credits.capacity)]
    return out


def peer_label(p: Peer) -> str:
    """host/8 hex digits of a hash of the peer's address (stable per peer process, not reversible)."""
    return f"{p.host}/{hashlib.blake2b(p.dest.encode(), digest_size=4).hexdigest()}"


def alive(host: str, pid: int, rt) -> bool:
    """False only when the peer runs on this host (`rt.host`, rt a UcxRuntime) and its
    process is gone."""
    if rt is None or host != rt.host or pid <= 0:
        return True
    return process_running(pid)


async def connect(rt, dest: str, credits: CreditWindow, timeout_s: float) -> Peer:
    """A `Peer` for the UcxReceiver at address `dest` (an endpoint to its worker address; the
    transfers' AUTH tell it where to reply); TransferError if it cannot be."""
    try:
        their_nonce, host, pid, address = wire.parse_address(dest)
    except ValueError as e:
        raise TransferError(f"cannot connect to {dest[:80]}: {e}") from None
    name = wire.peer_name(dest)
    if not alive(host, pid, rt):
        raise TransferError(f"cannot connect to {name}: process {pid} on {host} is gone")
    try:
        async with asyncio.timeout(timeout_s):
            ep = await rt.endpoint(address)
    except Exception as e:  # noqa: BLE001 - bad address bytes, UCX errors
        raise TransferError(f"cannot connect to {name}: {e!r}") from None
    peer = Peer(dest, their_nonce, host, pid, address, ep, credits, rt.path_to(host))
    log.debug("ucx sender -> %s: path %s", name, peer.path)
    return peer


async def wait_progress(out: Outgoing, fut: asyncio.Future, timeout_s: float, rt, drop_peer) -> bool:
    """Wait up to `timeout_s` for `fut`; False on timeout or when `out` failed. A peer on
    this host is probed by pid meanwhile (`drop_peer(peer, why)` once it is gone): UCX, error
    handling off, never reports a dead peer; the kernel does at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not fut.done() and not out.failed:
        left = deadline - loop.time()
        if left <= 0:
            return False
        await asyncio.wait([fut], timeout=min(left, PROBE_INTERVAL_S))
        if not fut.done() and not alive(out.peer.host, out.peer.pid, rt):
            drop_peer(out.peer, f"peer process {out.peer.pid} on {out.peer.host} is gone")
    return fut.done() and not out.failed
