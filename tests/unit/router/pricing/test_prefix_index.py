"""The router's approximate prefix index: longest run per worker, LRU bound, epochs, tenants."""

from __future__ import annotations

from router.pricing.prefix_index import PrefixIndex, block_hashes


def test_longest_leading_run_per_worker():
    idx = PrefixIndex()
    a = block_hashes(list(range(64)), 16, "t")             # 4 blocks
    b = block_hashes(list(range(32)) + [99] * 32, 16, "t")  # shares 2 leading blocks
    idx.record("w1", a)
    idx.record("w2", b)
    idx.record("w3", a[:1])
    assert idx.match(a) == {"w1": 4, "w2": 2, "w3": 1}
    assert idx.match(block_hashes([7] * 64, 16, "t")) == {}
    assert block_hashes(list(range(20)), 16, "t") == a[:1]  # trailing partial block has no key


def test_tenants_never_match_each_other():
    idx = PrefixIndex()
    idx.record("w1", block_hashes(list(range(32)), 16, "a"))
    assert idx.match(block_hashes(list(range(32)), 16, "b")) == {}


def test_lru_bound_and_epoch_change_forget():
    idx = PrefixIndex()
    idx.sync("w1", epoch=1, capacity_blocks=2)
    old = block_hashes(list(range(32)), 16, "t")
    new = block_hashes(list(range(100, 132)), 16, "t")
    idx.record("w1", old)
    idx.record("w1", new)  # evicts `old` (capacity 2 blocks)
    assert idx.match(old) == {} and idx.match(new) == {"w1": 2}
    idx.sync("w1", epoch=2)  # restarted: its cache is gone
    assert idx.match(new) == {} and len(idx) == 0
    idx.record("w2", new)
    assert idx.match(new) == {"w2": 2}
