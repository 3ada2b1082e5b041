"""Who holds which blocks on this worker (`pdctl blocks`; docs/design.md, Who holds which
blocks): the accounting behind WorkerAdmin.Blocks, with no gRPC.

Every block of the pool is in exactly one place:

    free           ref_count 0, no prefix key
    cached prefix  ref_count 0, keyed (reusable, evictable; owned by nobody)
    held           ref_count >= 1, charged to exactly one holding

A holding is one live engine sequence (`Engine.live`): its request, tenant,
transfer and generation come from the sequence itself (its id is the transfer
id, its salt the tenant), its state from the worker record that refers to it
(`Claim`: a decode reservation, a prefill task, a colocated request). A live
sequence no record refers to is UNOWNED. A block several sequences share (a
prefix hit) is charged to the oldest, so the charges add up:
free + cached_prefix + reserved + active == total. A held block no live sequence
lists (the engine itself lost it) is charged to one nameless UNOWNED holding.

Safety invariant: `take` reads the engine's block tables, so it runs on the
engine loop's thread (`EngineLoop.call`); the claims are read from the roles'
records on the event loop after it, so a sequence that had a record when the
engine was read still has it (results come back in the order commands ran).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from runtime.directory.records import TransferRef
from runtime.engine import Engine, SeqState, Sequence


class HoldState(enum.IntEnum):
    """A holding's lifecycle state (pd.v1.BlockHoldState, same numbers)."""

    PREFILLING = 1
    SENDING = 2
    RESERVED = 3
    RECEIVING = 4
    PUBLISHED = 5
    DECODING = 6
    UNOWNED = 7


RESERVING = frozenset({HoldState.RESERVED, HoldState.RECEIVING})
"""States whose blocks count as reserved (the rest of the held ones are active)."""


@dataclass(frozen=True, slots=True)
class Holding:
    """The blocks one sequence holds."""

    request_id: str
    tenant: str
    transfer_id: str
    generation: int
    state: HoldState
    age_s: float
    block_ids: tuple[int, ...]
    """Physical ids in table order (shared prefix blocks included)."""
    charged: int
    """Blocks charged to this holding (not to an older one sharing them)."""


@dataclass(frozen=True, slots=True)
class BlockView:
    """One worker's pool, every block accounted for once."""

    total: int
    free: int
    cached_prefix: int
    holdings: tuple[Holding, ...]
    """Oldest first."""

    @property
    def reserved(self) -> int:
        """Blocks charged to RESERVED and RECEIVING holdings."""
        return sum(h.charged for h in self.holdings if h.state in RESERVING)

    @property
    def active(self) -> int:
        """Blocks charged to every other holding."""
        return sum(h.charged for h in self.holdings if h.state not in RESERVING)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What `take` read on the engine thread: the pool's counts and each live sequence."""

    total: int
    free: int
    cached_prefix: int
    sequences: tuple[tuple[Sequence, tuple[int, ...], bool], ...]
    """(sequence, its block table, whether it has reached decoding), oldest first."""
    stray: tuple[int, ...]
    """Held blocks no live sequence lists."""
    taken_s: float


def take(engine: Engine) -> Snapshot:
    """Engine thread: the pool and the live sequences' tables, copied."""
    seqs = sorted(engine.live.values(), key=lambda s: s.created_s)
    listed = {b for s in seqs for b in s.block_table}
    stray = tuple(b for b in engine.held_blocks() if b not in listed)
    tables = tuple((s, tuple(s.block_table), s.state >= SeqState.DECODING) for s in seqs)
    total, free, cached = engine.pool_counts()
    return Snapshot(total, free, cached, tables, stray, time.monotonic())


Claim = tuple[HoldState, HoldState]
"""What a worker record says of its sequence: (its state while the prompt is not yet
computed, its state once the sequence decodes), e.g. a prefill (PREFILLING, SENDING),
a colocated request (PREFILLING, DECODING), a published hand-off (PUBLISHED, DECODING).
The record lives on the event loop, the sequence's progress on the engine thread."""


def view(snap: Snapshot, claims: Mapping[int, Claim], request_id: str = "") -> BlockView:
    """The holdings of `snap`, states from `claims` (id(sequence) -> Claim; none:
    UNOWNED). `request_id` keeps only that request's holdings (the counts stay the
    whole pool's)."""
    charged: set[int] = set()
    out: list[Holding] = []
    unowned = (HoldState.UNOWNED, HoldState.UNOWNED)
    for seq, table, decoding in snap.sequences:
        state = claims.get(id(seq), unowned)[decoding]
        mine = [b for b in dict.fromkeys(table) if b not in charged]
        charged.update(mine)
        ref = _ref(seq.request_id)
        out.append(Holding(ref.request_id if ref else seq.request_id, seq.salt.decode(errors="replace"),
                           seq.request_id, ref.generation if ref else 0, state,
                           max(0.0, snap.taken_s - seq.created_s), table, len(mine)))
    if snap.stray:
        out.append(Holding("", "", "", 0, HoldState.UNOWNED, 0.0, snap.stray, len(snap.stray)))
    held = snap.total - snap.free - snap.cached_prefix
    assert sum(h.charged for h in out) == held, f"{held} held blocks, {sum(h.charged for h in out)} charged"
    if request_id:
        out = [h for h in out if h.request_id == request_id]
    return BlockView(snap.total, snap.free, snap.cached_prefix, tuple(out))


def _ref(transfer_id: str) -> TransferRef | None:
    try:
        return TransferRef.parse(transfer_id)
    except ValueError:
        return None


def ranges(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Physical ids as (start, count) runs of consecutive ids, in the given order."""
    runs: list[tuple[int, int]] = []
    for b in ids:
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return runs
