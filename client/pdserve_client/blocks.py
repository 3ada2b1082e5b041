"""Who holds which K/V blocks (Admin.Blocks, `pdctl blocks`) as plain values, and
their conversion from pd.v1.

On every worker each block is free (a new request can take it now), or charged to
one holding, so free + reserved + active == total; cached_prefix is the part of free
that still holds a reusable prompt prefix (owned by nobody: the next allocation may
take it). That is the load reports' definition, which `pdctl status` shows: both
commands print FREE and CACHED alike. The wire counts them apart (pd.v1.WorkerBlocks:
free_blocks holds no prefix; docs/design.md, Who holds which blocks);
`worker_blocks_from_proto` adds them up. A holding is one sequence: request, tenant,
transfer, generation, state (prefilling, sending, reserved, receiving, published,
decoding, unowned), age. The router flags orphans — holdings nothing will give back
(router/blocks.py has the rule) — with the reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pdserve_client.rpc.pd.v1 import admin_pb2, blocks_pb2


@dataclass(frozen=True, slots=True)
class BlockHolding:
    """The blocks one sequence holds on a worker."""

    request_id: str
    """Request holding them ('' for blocks no sequence lists)."""
    tenant: str
    """Tenant of the request."""
    transfer_id: str
    """Transfer id the sequence was allocated under ("request_id/generation")."""
    generation: int
    """Request generation."""
    state: str
    """prefilling, sending, reserved, receiving, published, decoding or unowned."""
    age_s: float
    """Seconds since the blocks were allocated."""
    num_blocks: int
    """Blocks in its table (shared prefix blocks included)."""
    charged_blocks: int
    """Blocks charged to it (a shared block is charged to the oldest holding)."""
    ranges: tuple[tuple[int, int], ...]
    """Physical block ids as (first, count) runs."""
    orphan: bool
    """Nothing claims it (the router's judgement)."""
    orphan_reason: str
    """Why it is an orphan; '' otherwise."""

    @property
    def block_ids(self) -> list[int]:
        """The physical block ids, in table order."""
        return [b for start, count in self.ranges for b in range(start, start + count)]

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class WorkerBlocks:
    """One worker's pool: free + reserved + active == total, cached_prefix <= free."""

    worker_id: str
    """Worker id."""
    role: str
    """prefill, decode or mixed."""
    epoch: int
    """The worker's registration epoch as it reports it."""
    total_blocks: int
    """Blocks in the pool."""
    free_blocks: int
    """Blocks a new request can take now: the unreferenced prefix cache included."""
    cached_prefix_blocks: int
    """Of the free blocks, those kept for prefix reuse (owned by nobody, never orphans)."""
    reserved_blocks: int
    """Charged to reserved and receiving holdings."""
    active_blocks: int
    """Charged to every other holding."""
    orphan_blocks: int
    """Charged to orphan holdings."""
    error: str
    """Why the worker gave no answer ('' when it did; its counts are then 0)."""
    holdings: tuple[BlockHolding, ...]
    """Oldest first."""

    @property
    def held_blocks(self) -> int:
        """Blocks some holding is charged with."""
        return self.reserved_blocks + self.active_blocks

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class BlocksView:
    """Every asked worker's blocks, with orphans judged."""

    workers: tuple[WorkerBlocks, ...]
    """By worker id."""
    orphan_holdings: int
    """Orphan holdings over all workers."""
    in_flight_requests: int
    """Requests in flight at the router when it judged."""
    open_transactions: int
    """Transactions open in the directory when it judged."""

    @property
    def orphans(self) -> list[tuple[str, BlockHolding]]:
        """(worker id, holding) of every orphan."""
        return [(w.worker_id, h) for w in self.workers for h in w.holdings if h.orphan]

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


def _state_name(number: int) -> str:
    try:
        return blocks_pb2.BlockHoldState.Name(number).removeprefix("BLOCK_HOLD_STATE_").lower()
    except ValueError:
        return f"unknown({number})"


def holding_from_proto(h: blocks_pb2.BlockHolding) -> BlockHolding:
    """pd.v1.BlockHolding -> BlockHolding."""
    return BlockHolding(h.request_id, h.tenant, h.transfer_id, h.generation, _state_name(h.state), h.age_s,
                        h.num_blocks, h.charged_blocks, tuple((r.start, r.count) for r in h.ranges),
                        h.orphan, h.orphan_reason)


def worker_blocks_from_proto(w: blocks_pb2.WorkerBlocks) -> WorkerBlocks:
    """pd.v1.WorkerBlocks -> WorkerBlocks (its free blocks and cached prefix blocks, both
    free to take, counted together as free)."""
    return WorkerBlocks(w.worker_id, w.role, w.epoch, w.total_blocks, w.free_blocks + w.cached_prefix_blocks,
                        w.cached_prefix_blocks, w.reserved_blocks, w.active_blocks, w.orphan_blocks, w.error,
                        tuple(holding_from_proto(h) for h in w.holdings))


def blocks_from_proto(r: admin_pb2.BlocksResponse) -> BlocksView:
    """pd.v1.BlocksResponse -> BlocksView."""
    return BlocksView(tuple(worker_blocks_from_proto(w) for w in r.workers), r.orphan_holdings,
                      r.in_flight_requests, r.open_transactions)
