"""A decode-side reservation and the checks that gate its publication.

    RESERVED --first chunk--> RECEIVING --commit ok--> PUBLISHED --done--> FINISHED
        \\____________________________\\__ any failure, cancel or TTL __--> ABORTED

(PUBLISHED ahead of its first token — a commit with TOKEN_FOLLOWS — is `awaiting_token`
until the token's COMMIT admits it; until then a failure, cancel or TTL ends it ABORTED.)

Safety invariant: a reservation's blocks are read by decode only after
PUBLISHED, and PUBLISHED is entered only after `validate_commit` found every
expected chunk (the list planned at reserve) present exactly once with the
commit's checksum, the cache ABI equal and the generation current, and the
directory validated (this worker's K/V digest is the one the source declared,
the chunk list is the manifest's) and its compare-and-set succeeded.
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field

from runtime.common.lifecycle import Moves
from runtime.directory.chunk_plan import Layout
from runtime.engine import Sequence
from runtime.transfer import ChunkArrived, ChunkKey, TransferCommit
from runtime.worker.capabilities import Ahead, Grant, physical_blocks
from runtime.worker.loop import AsyncSink

from .tracing import ReservationTrace


class ResState(enum.IntEnum):
    """Ordered: `>= FINISHED` means over. Moves only through `advance` (the machine in
    the module docstring; a transfer set the destination already holds entirely
    goes from RESERVED straight to PUBLISHED, and a published sequence that fails
    while decoding ends ABORTED)."""

    RESERVED = 0
    RECEIVING = 1
    PUBLISHED = 2
    FINISHED = 3
    ABORTED = 4


_MOVES = Moves({
    ResState.RESERVED: {ResState.RECEIVING, ResState.PUBLISHED, ResState.ABORTED},
    ResState.RECEIVING: {ResState.PUBLISHED, ResState.ABORTED},
    ResState.PUBLISHED: {ResState.FINISHED, ResState.ABORTED},
    ResState.FINISHED: (),
    ResState.ABORTED: (),
})


def advance(res: Reservation, to: ResState) -> None:
    """Move `res` to `to`; an illegal move is a bug and raises (nothing is changed)."""
    res.state = _MOVES.check(res.state, to, f"reservation {res.transfer_id}")


@dataclass
class Reservation:
    """Blocks held for one transfer (request_id at one generation)."""

    transfer_id: str
    request_id: str
    tenant: str
    generation: int
    seq: Sequence
    num_layers: int
    first_block: int
    """First logical block of the transfer set (blocks before it are local prefix hits)."""
    last_block: int
    """One past the last prompt block."""
    expected: dict[ChunkKey, int]
    """The transfer set as planned at reserve: chunk -> bytes, in manifest order (the
    router copies it into the manifest; the source must send exactly these)."""
    deadline_s: float
    state: ResState = ResState.RESERVED
    received: dict[ChunkKey, ChunkArrived] = field(default_factory=dict)
    admitted: set[ChunkKey] = field(default_factory=set)
    """Chunks whose bytes the receiver was allowed to write (each at most once)."""
    abort_reason: str = ""
    kv_digest: str = ""
    """Digest of the prompt K/V as published (set at publication)."""
    source_seal: bytes = b""
    """The source's seal from its COMMIT, as the directory opened it at publication (empty:
    the source declared with a Begin); relayed with token 0 for the router to open too."""
    sealed_chunks: tuple = ()
    """The chunk list (ChunkSpecs, with checksums) the seal covers, as published."""
    published: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the reservation leaves RESERVED/RECEIVING (published or aborted)."""
    token_0_out: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a DecodeStream handed token 0 to gRPC (admission.py: what waits for it)."""
    created_s: float = field(default_factory=time.monotonic)
    sink: AsyncSink | None = None
    """The published sequence's token stream; tokens wait in it until DecodeStream reads them."""
    streamed: bool = False
    """A DecodeStream has attached to this reservation."""
    stream_came: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the router's DecodeStream for it first came: the router sends it once the
    directory recorded the transaction, so the Publish (and a capability check against
    the record) waits for it (docs/design.md, "The protocol is one-way")."""
    cancelled: bool = False
    """Cancel came after publication: stop it (before or after it joined the batch)."""
    awaiting_token: bool = False
    """Published by a commit sent ahead of the first token (TOKEN_FOLLOWS): its blocks hold
    the published K/V, not admitted yet; the token's COMMIT admits it. Meanwhile a failure,
    cancel or the TTL gives it back like an unpublished one (the publication released)."""
    grant: Grant | None = None
    """What the sender's capability allows (runtime/worker/capabilities.py); None
    until authorized (or with security off)."""
    granted_bytes: int = 0
    """Bytes admitted under the grant so far."""
    ahead: Ahead | None = None
    """The router's copy of the capability, being checked ahead of the sender's AUTH."""
    auth_started: bool = False
    """A sender's AUTH is being checked the full way (no copy ahead needed any more)."""
    trace: ReservationTrace = field(default_factory=lambda: ReservationTrace(0))
    """Its trace context and noted times (decode_worker/tracing.py)."""

    @property
    def expected_bytes(self) -> int:
        """Bytes the transfer must bring."""
        return sum(self.expected.values())

    @property
    def regions(self) -> tuple[int, ...]:
        """The physical blocks the transfer set lands in (what a capability must grant)."""
        return physical_blocks(self.seq.block_table, self.expected)

    def expected_layouts(self) -> list[Layout]:
        """The expected chunks as (layer, block_start, block_count, num_bytes), in order."""
        return [(k.layer, k.block_start, k.block_count, n) for k, n in self.expected.items()]

    def admit_chunk_key(self, key: ChunkKey) -> None:
        """Raise KeyError unless `key` is an expected chunk that has not arrived yet and
        lies inside the capability's grant (its blocks, and the byte bound)."""
        if key not in self.expected:
            raise KeyError(f"chunk {key} is not in the expected list of {self.transfer_id} "
                           f"(blocks [{self.first_block}, {self.last_block}) of {self.num_layers} layers)")
        if key in self.admitted:
            raise KeyError(f"duplicate chunk {key}")
        if self.grant is not None:
            outside = set(physical_blocks(self.seq.block_table, [key])) - self.grant.blocks
            if outside:
                raise KeyError(f"chunk {key} writes blocks {sorted(outside)[:4]} its capability does not grant")
            if self.granted_bytes + self.expected[key] > self.grant.max_bytes:
                raise KeyError(f"chunk {key} goes past the capability's {self.grant.max_bytes} bytes")
            self.granted_bytes += self.expected[key]
        self.admitted.add(key)


def validate_commit(res: Reservation, commit: TransferCommit, abi_digest: str) -> str:
    """Why `commit` must not be published, or '' when it may."""
    if res.state not in (ResState.RESERVED, ResState.RECEIVING):
        return f"reservation is {res.state.name}"
    if commit.request_id != res.request_id or commit.generation != res.generation:
        return (f"commit for {commit.request_id}@{commit.generation} does not match "
                f"reservation {res.request_id}@{res.generation}")
    if commit.cache_abi_digest != abi_digest:
        return f"cache ABI {commit.cache_abi_digest} != local {abi_digest}"
    listed = {c.key: c for c in commit.chunks}
    if len(listed) != len(commit.chunks):
        return "the commit lists a chunk twice"
    if listed.keys() != res.expected.keys():  # in any order: streamed chunks leave as layers finish
        return "the commit's chunk list is not the expected one"
    if set(res.received) != set(res.expected):
        missing = sorted(set(res.expected) - set(res.received), key=_order)[:3]
        return f"chunks missing {missing}"
    for key, spec in listed.items():
        got = res.received[key]
        if got.checksum != spec.checksum or not got.num_bytes == spec.num_bytes == res.expected[key]:
            return f"checksum mismatch on chunk {key}"
    return ""


def _order(key: ChunkKey):
    return (key.layer, key.block_start)
