"""BlockManager bookkeeping and the prefix hash chain, without a model."""

from __future__ import annotations

import random

import pytest

from runtime.engine.block_manager import BlockManager
from runtime.engine.errors import OutOfBlocks
from runtime.engine.prefix import hash_blocks


def key(name: str) -> bytes:
    """A stand-in prefix key."""
    return name.encode().ljust(16, b".")


def check_invariants(bm: BlockManager) -> None:
    """Every block is in exactly one place: free, cached (LRU) or in use."""
    free, cached = list(bm.free_ids), list(bm.lru)
    in_use = [b.block_id for b in bm.blocks if b.ref_count > 0]
    assert sorted(free + cached + in_use) == list(range(bm.num_blocks)), (free, cached, in_use)
    assert all(bm.blocks[b].ref_count == 0 and bm.blocks[b].key is None for b in free)
    assert all(bm.blocks[b].ref_count == 0 and bm.blocks[b].key is not None for b in cached)
    assert all(b.ref_count >= 0 for b in bm.blocks)
    assert {k: bid for k, bid in bm.by_key.items()} == {
        b.key: b.block_id for b in bm.blocks if b.key is not None}
    assert bm.num_free == len(free) + len(cached)
    assert bm.num_cached == len(cached)


def test_shared_prefix_blocks_are_ref_counted():
    bm = BlockManager(8)
    a, reused = bm.allocate([], 0, 3)
    assert reused == 0 and len(set(a)) == 3
    bm.register(a[0], key("p0"))
    bm.register(a[1], key("p1"))
    # b shares a's two registered blocks while a still holds them.
    b, reused = bm.allocate([key("p0"), key("p1"), key("other")], 3, 4)
    assert reused == 2 and b[:2] == a[:2] and not set(b[2:]) & set(a)
    assert [bm.blocks[i].ref_count for i in a] == [2, 2, 1]
    assert bm.num_free == 8 - 5
    check_invariants(bm)

    bm.free(a)
    assert [bm.blocks[i].ref_count for i in a] == [1, 1, 0]
    assert bm.num_free == 8 - 4 and bm.num_cached == 0  # shared blocks still held by b
    check_invariants(bm)
    bm.free(b)
    assert bm.num_free == 8 and bm.num_cached == 2
    assert bm.match_prefix([key("p0"), key("p1")]) == a[:2]
    check_invariants(bm)


def test_max_reuse_limits_the_prefix_hit():
    bm = BlockManager(6)
    a, _ = bm.allocate([], 0, 3)
    for i, bid in enumerate(a):
        bm.register(bid, key(f"p{i}"))
    bm.free(a)
    keys = [key("p0"), key("p1"), key("p2")]
    b, reused = bm.allocate(keys, 1, 3)
    assert reused == 1 and b[0] == a[0] and not set(b[1:]) & set(a)
    # The blocks past max_reuse stay cached and unreferenced.
    assert bm.match_prefix(keys) == a and bm.num_cached == 2
    bm.free(b)
    check_invariants(bm)


def test_lru_evicts_least_recently_freed_first_and_forgets_its_key():
    bm = BlockManager(4)
    tables = {}
    for name in ("x", "y", "z"):
        tables[name], _ = bm.allocate([], 0, 1)
        bm.register(tables[name][0], key(name))
    for name in ("y", "x", "z"):  # freed in this order: y is the oldest cached block
        bm.free(tables[name])
    check_invariants(bm)
    # Touch y again: a reuse makes it the most recently freed.
    again, reused = bm.allocate([key("y")], 1, 1)
    assert reused == 1 and again == tables["y"]
    bm.free(again)

    spare, _ = bm.allocate([], 0, 1)  # the one never-cached block goes first
    assert bm.num_cached == 3
    evicted, _ = bm.allocate([], 0, 1)
    assert evicted == tables["x"]
    assert bm.blocks[evicted[0]].key is None and bm.match_prefix([key("x")]) == []
    assert bm.match_prefix([key("z")]) == tables["z"]
    assert bm.match_prefix([key("y")]) == tables["y"]
    evicted2, _ = bm.allocate([], 0, 1)
    assert evicted2 == tables["z"] and bm.match_prefix([key("z")]) == []
    check_invariants(bm)
    for t in (spare, evicted, evicted2):
        bm.free(t)
    assert bm.num_free == 4 and bm.num_cached == 1
    check_invariants(bm)


def test_a_freed_prefix_is_evicted_tail_first():
    bm = BlockManager(3)
    table, _ = bm.allocate([], 0, 3)
    for i, bid in enumerate(table):
        bm.register(bid, key(f"p{i}"))
    bm.free(table)
    taken, _ = bm.allocate([], 0, 1)
    assert taken == [table[2]]
    # The head survives, so the longest remaining prefix is still a prefix.
    assert bm.match_prefix([key("p0"), key("p1"), key("p2")]) == table[:2]
    bm.free(taken)
    check_invariants(bm)


def test_register_first_writer_wins():
    bm = BlockManager(4)
    (first, second), _ = bm.allocate([], 0, 2)
    bm.register(first, key("k"))
    bm.register(second, key("k"))  # same prefix computed twice: the second copy stays private
    assert bm.by_key[key("k")] == first and bm.blocks[second].key is None
    bm.register(first, key("other"))  # a block keeps the key it has
    assert bm.blocks[first].key == key("k") and key("other") not in bm.by_key
    bm.free([first, second])
    assert list(bm.lru) == [first] and second in bm.free_ids
    check_invariants(bm)


def test_register_of_an_unheld_block_asserts():
    bm = BlockManager(2)
    with pytest.raises(AssertionError, match="nobody holds"):
        bm.register(0, key("k"))
    check_invariants(bm)


def test_double_free_asserts_and_changes_nothing():
    bm = BlockManager(4)
    table, _ = bm.allocate([], 0, 2)
    bm.register(table[0], key("k"))
    bm.free(table)
    before = (list(bm.free_ids), list(bm.lru), [b.ref_count for b in bm.blocks])
    with pytest.raises(AssertionError, match=f"double free of block {table[1]}"):
        bm.free(table)
    assert (list(bm.free_ids), list(bm.lru), [b.ref_count for b in bm.blocks]) == before
    check_invariants(bm)


def test_allocate_is_all_or_nothing():
    bm = BlockManager(6)
    cached, _ = bm.allocate([], 0, 2)
    bm.register(cached[0], key("p0"))
    bm.register(cached[1], key("p1"))
    bm.free(cached)
    holder, _ = bm.allocate([], 0, 2)  # from free_ids: 2 free + 2 cached left
    snapshot = (list(bm.free_ids), list(bm.lru), dict(bm.by_key), [b.ref_count for b in bm.blocks])

    with pytest.raises(OutOfBlocks) as e:
        bm.allocate([], 0, 5)
    assert (e.value.needed_blocks, e.value.free_blocks, e.value.total_blocks) == (5, 4, 6)
    # With two hits, the hits stop being evictable: 3 fresh needed, 2 available.
    with pytest.raises(OutOfBlocks) as e:
        bm.allocate([key("p0"), key("p1")], 2, 5)
    assert (e.value.needed_blocks, e.value.free_blocks) == (3, 2)
    assert (list(bm.free_ids), list(bm.lru), dict(bm.by_key),
            [b.ref_count for b in bm.blocks]) == snapshot
    check_invariants(bm)

    full, reused = bm.allocate([key("p0"), key("p1")], 2, 4)  # exactly fits
    assert reused == 2 and full[:2] == cached and bm.num_free == 0
    check_invariants(bm)
    bm.free(full)
    bm.free(holder)
    assert bm.num_free == 6
    check_invariants(bm)


def test_hits_held_by_another_sequence_do_not_reduce_the_free_count():
    bm = BlockManager(4)
    a, _ = bm.allocate([], 0, 2)
    bm.register(a[0], key("p0"))
    b, reused = bm.allocate([key("p0")], 1, 3)  # 1 shared + 2 fresh == all that is free
    assert reused == 1 and bm.num_free == 0
    bm.free(a)
    bm.free(b)
    assert bm.num_free == 4
    check_invariants(bm)


def test_clear_cache_frees_only_unreferenced_cached_blocks():
    bm = BlockManager(4)
    t, _ = bm.allocate([], 0, 2)
    bm.register(t[0], key("a"))
    bm.register(t[1], key("b"))
    bm.free(t[1:])
    bm.clear_cache()
    assert bm.match_prefix([key("a")]) == [t[0]] and bm.match_prefix([key("b")]) == []
    bm.free(t[:1])
    assert bm.num_cached == 1 and bm.num_free == 4
    check_invariants(bm)


# ---- hash_blocks ------------------------------------------------------------------

BS = 16
IDENT = "abi-digest-1"


def _tokens(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(32000) for _ in range(n)]


def test_hash_blocks_is_deterministic_and_one_key_per_full_block():
    toks = _tokens(5 * BS + 7)
    keys = hash_blocks(toks, BS, IDENT, b"tenant")
    assert keys == hash_blocks(list(toks), BS, IDENT, b"tenant")
    assert len(keys) == 5 and len(set(keys)) == 5
    assert all(isinstance(k, bytes) and len(k) == 16 for k in keys)


def test_partial_trailing_block_has_no_key():
    toks = _tokens(4 * BS)
    full = hash_blocks(toks, BS, IDENT)
    for n in (4 * BS - 1, 3 * BS + 1):
        assert hash_blocks(toks[:n], BS, IDENT) == full[:3]
    assert hash_blocks(toks[:BS - 1], BS, IDENT) == []
    # Tokens of the trailing partial block do not matter.
    tail_changed = toks[:3 * BS] + [t + 1 for t in toks[3 * BS:4 * BS - 1]]
    assert hash_blocks(tail_changed, BS, IDENT) == full[:3]


@pytest.mark.parametrize("j", [0, 2, 5])
@pytest.mark.parametrize("offset", [0, BS - 1])
def test_a_change_in_block_j_changes_keys_from_j_on(j, offset):
    toks = _tokens(6 * BS + 3, seed=1)
    base = hash_blocks(toks, BS, IDENT)
    changed = list(toks)
    changed[j * BS + offset] += 1
    new = hash_blocks(changed, BS, IDENT)
    assert new[:j] == base[:j]
    assert all(a != b for a, b in zip(new[j:], base[j:]))
    assert len(new) == len(base) == 6


def test_equal_blocks_at_different_depths_get_different_keys():
    block = _tokens(BS, seed=2)
    keys = hash_blocks(block * 3, BS, IDENT)
    assert len(set(keys)) == 3  # a key names the whole prefix, not the block alone


@pytest.mark.parametrize("other", [dict(salt=b"tenant-b"), dict(cache_identity="abi-digest-2")],
                         ids=["salt", "identity"])
def test_different_salt_or_identity_gives_disjoint_keys(other):
    toks = _tokens(8 * BS, seed=3)
    base = hash_blocks(toks, BS, IDENT, b"tenant-a")
    kw = dict(cache_identity=IDENT, salt=b"tenant-a") | other
    new = hash_blocks(toks, BS, **kw)
    assert len(new) == len(base) and not set(new) & set(base)



def test_unregister_takes_blocks_out_of_the_prefix_cache():
    """K/V that failed a check after registration (the router's digest comparison) is
    never matched again; an unreferenced block goes straight back to the free list."""
    bm = BlockManager(4)
    table, _ = bm.allocate([b"a", b"b"], 0, 2)
    bm.register(table[0], b"a")
    bm.register(table[1], b"b")
    bm.free(table)
    assert bm.match_prefix([b"a", b"b"]) == table and bm.num_cached == 2
    bm.unregister([table[1]])
    assert bm.match_prefix([b"a", b"b"]) == [table[0]]
    assert bm.num_cached == 1 and bm.num_free == 4
    held, _ = bm.allocate([b"a"], 1, 1)  # a held block: unregistered, still held
    bm.unregister(held)
    assert bm.match_prefix([b"a"]) == [] and bm.blocks[held[0]].ref_count == 1
    bm.free(held)
    assert bm.num_free == 4 and bm.num_cached == 0
