"""Block bookkeeping: ref-counted blocks, prefix reuse, LRU eviction.

A block is in exactly one of three places:
  free      ref_count == 0, no key         (free_ids)
  cached    ref_count == 0, has a key      (lru, evictable, reusable by key)
  in use    ref_count >= 1                 (held by one or more sequences)
`num_free` counts free + cached: both can be handed out now, so a test that
finds `num_free == num_blocks` after a lifecycle has proven nothing leaked.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from .errors import OutOfBlocks


@dataclass(slots=True)
class Block:
    """One physical block's metadata."""

    block_id: int
    ref_count: int = 0
    key: bytes | None = None


class BlockManager:
    """Allocates physical blocks to sequences and shares full prefix blocks by key."""

    def __init__(self, num_blocks: int):
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest first
        self.by_key: dict[bytes, int] = {}

    @property
    def num_blocks(self) -> int:
        """Pool size."""
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (free plus evictable cached)."""
        return len(self.free_ids) + len(self.lru)

    @property
    def num_cached(self) -> int:
        """Unreferenced blocks kept for prefix reuse."""
        return len(self.lru)

    def match_prefix(self, keys: list[bytes]) -> list[int]:
        """Physical ids of the longest leading run of `keys` present in the cache."""
        hits = []
        for key in keys:
            bid = self.by_key.get(key)
            if bid is None:
                break
            hits.append(bid)
        return hits

    def allocate(self, keys: list[bytes], max_reuse: int, total: int) -> tuple[list[int], int]:
        """Block table of `total` blocks reusing up to `max_reuse` leading cached ones.

        Returns (block ids, number reused). All or nothing: on OutOfBlocks no
        reference was taken.
        """
        reused = self.match_prefix(keys[:max_reuse])
        fresh = total - len(reused)
        # Reused blocks sitting in the LRU stop being evictable, so they don't count as free.
        available = self.num_free - sum(1 for b in reused if b in self.lru)
        if fresh > available:
            raise OutOfBlocks(fresh, available, self.num_blocks)
        for bid in reused:
            self._ref(bid)
        table = reused + [self._take_fresh() for _ in range(fresh)]
        return table, len(reused)

    def _ref(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count == 0:
            self.lru.pop(bid)
        block.ref_count += 1

    def _take_fresh(self) -> int:
        if self.free_ids:
            bid = self.free_ids.popleft()
        else:
            bid, _ = self.lru.popitem(last=False)  # evict the least recently used
            del self.by_key[self.blocks[bid].key]
            self.blocks[bid].key = None
        block = self.blocks[bid]
        assert block.ref_count == 0 and block.key is None
        block.ref_count = 1
        return bid

    def register(self, bid: int, key: bytes) -> None:
        """Make a fully written block findable by its prefix key (first writer wins)."""
        block = self.blocks[bid]
        assert block.ref_count > 0, "registering a block nobody holds"
        if block.key is None and key not in self.by_key:
            block.key = key
            self.by_key[key] = bid

    def free(self, table: list[int]) -> None:
        """Drop one reference to each block; keyed blocks stay cached, others go free."""
        # Reverse order: a prefix's tail is evicted before its head.
        for bid in reversed(table):
            block = self.blocks[bid]
            assert block.ref_count > 0, f"double free of block {bid}"
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.key is not None:
                    self.lru[bid] = None
                else:
                    self.free_ids.append(bid)

    def unregister(self, ids: list[int]) -> None:
        """Take blocks out of the prefix cache (their K/V failed a check after it was
        registered): no later request matches them; unreferenced ones go free."""
        for bid in ids:
            block = self.blocks[bid]
            if block.key is not None and self.by_key.get(block.key) == bid:
                del self.by_key[block.key]
            block.key = None
            if block.ref_count == 0 and bid in self.lru:
                del self.lru[bid]
                self.free_ids.append(bid)

    def clear_cache(self) -> None:
        """Forget every unreferenced cached block (e.g. after a weights change)."""
        while self.lru:
            bid, _ = self.lru.popitem(last=False)
            del self.by_key[self.blocks[bid].key]
            self.blocks[bid].key = None
            self.free_ids.append(bid)
