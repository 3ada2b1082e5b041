"""The router's approximate prefix index: which worker likely holds which prompt blocks.

Workers do not publish their prefix caches yet, and a directory round trip per
request would cost more than the whole decision, so the router keeps its own
index from what it dispatched: after a request runs, P (or W) holds the prompt's
full blocks in its prefix cache, and so does D. Keys are a hash chain over full
blocks of one tenant (like runtime/engine/prefix.py, but with Python's fast
tuple hash: the index is process-local, never compared with workers' keys):

    h_0 = hash((tenant, block_size)),  h_j = hash((h_{j-1}, tokens of block j))

Each key maps to a bitmask of worker slots, so the longest leading run per
worker is one walk down the chain ANDing masks until none is left: O(matched
blocks), independent of the number of workers.

Approximation, on purpose: evictions at the worker are not seen (each worker's
entries are an LRU capped at its block count), so a hit may be stale. That only
misprices a route; correctness never depends on it — Decode.Reserve reports the
blocks D really holds and prefill recomputes what it really lacks. A worker
that re-registers (new epoch) lost its cache, so its entries are dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(tokens: Sequence[int], block_size: int, tenant: str) -> list[int]:
    """Chain keys of every full block of `tokens` (a trailing partial block has none)."""
    if block_size <= 0:
        return []
    prev = hash((tenant, block_size))
    t = tuple(tokens)
    out = []
    for start in range(0, len(t) - block_size + 1, block_size):
        prev = hash((prev, t[start:start + block_size]))
        out.append(prev)
    return out


class PrefixIndex:
    """Chain key -> bitmask of worker slots, with a per-worker LRU bound."""

    def __init__(self, default_capacity_blocks: int = 4096):
        self._default_capacity = default_capacity_blocks
        self._masks: dict[int, int] = {}
        self._slots: dict[str, int] = {}
        self._ids: dict[int, str] = {}
        self._epochs: dict[str, int] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}
        self._free_slots: list[int] = []

    def __len__(self) -> int:
        """Distinct chain keys held by at least one worker."""
        return len(self._masks)

    def _slot(self, worker_id: str) -> int:
        slot = self._slots.get(worker_id)
        if slot is None:
            slot = self._free_slots.pop() if self._free_slots else len(self._slots)
            self._slots[worker_id], self._ids[slot] = slot, worker_id
            self._lru[worker_id] = OrderedDict()
        return slot

    def sync(self, worker_id: str, epoch: int, capacity_blocks: int = 0) -> None:
        """Tell the index a worker's epoch and cache size; a new epoch drops its entries."""
        if self._epochs.get(worker_id, epoch) != epoch:
            self.forget(worker_id)
        self._epochs[worker_id] = epoch
        if capacity_blocks > 0:
            self._capacity[worker_id] = capacity_blocks

    def record(self, worker_id: str, hashes: Sequence[int]) -> None:
        """`worker_id` now holds these leading blocks (most recently used)."""
        if not hashes:
            return
        bit = 1 << self._slot(worker_id)
        lru = self._lru[worker_id]
        masks = self._masks
        for h in hashes:
            masks[h] = masks.get(h, 0) | bit
            lru[h] = None
            lru.move_to_end(h)
        cap = self._capacity.get(worker_id, self._default_capacity)
        while len(lru) > cap:
            self._drop(lru.popitem(last=False)[0], bit)

    def _drop(self, h: int, bit: int) -> None:
        m = self._masks.get(h, 0) & ~bit
        if m:
            self._masks[h] = m
        else:
            self._masks.pop(h, None)

    def forget(self, worker_id: str) -> None:
        """Drop everything recorded for `worker_id` (it restarted or left)."""
        slot = self._slots.pop(worker_id, None)
        if slot is None:
            return
        bit = 1 << slot
        for h in self._lru.pop(worker_id):
            self._drop(h, bit)
        del self._ids[slot]
        self._epochs.pop(worker_id, None)
        self._free_slots.append(slot)

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Worker id -> number of leading `hashes` it holds (only workers with >= 1)."""
        masks = self._masks
        out: dict[str, int] = {}
        live = -1
        for j, h in enumerate(hashes):
            m = masks.get(h, 0) & live
            ended = live & ~m if live != -1 else 0
            if ended:
                self._credit(out, ended, j)
            if not m:
                return out
            live = m
        if live not in (-1, 0):
            self._credit(out, live, len(hashes))
        return out

    def _credit(self, out: dict[str, int], mask: int, blocks: int) -> None:
        ids = self._ids
        while mask:
            low = mask & -mask
            out[ids[low.bit_length() - 1]] = blocks
            mask ^= low
