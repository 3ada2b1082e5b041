"""Router placement: pure functions over a snapshot, the dispatch overlay, the failure memory."""

from __future__ import annotations

import pytest

from router.requests.placement import (
    Demand,
    FailureMemory,
    LoadOverlay,
    blocks_needed,
    capacity_shortfall,
    choose_colocated,
    choose_pair,
    free_blocks,
    pending_prefill_tokens,
    rejects,
)
from runtime.directory.records import ClusterSnapshot, LoadReport, WorkerCapacity, WorkerRecord, WorkerRole

CAP = WorkerCapacity(total_blocks=100, max_decode_batch=8, max_prefill_tokens=512, block_size=16, vocab_size=512,
                     max_model_len=2048)


def worker(worker_id: str, role: WorkerRole, *, pending: int = 0, free: int = 100, abi: str = "abi-a",
           cap: WorkerCapacity = CAP, epoch: int = 1, lease: int = 1000, batch: int = 0) -> WorkerRecord:
    return WorkerRecord(worker_id, role, f"{worker_id}:1", f"{worker_id}:2", abi, cap,
                        LoadReport(pending_prefill_tokens=pending, active_decode_batch=batch, free_blocks=free,
                                   total_blocks=cap.total_blocks), epoch, lease)


def cluster(*workers: WorkerRecord) -> ClusterSnapshot:
    return ClusterSnapshot(tuple(workers), route_epoch=3)


DEMAND = Demand(prompt_tokens=40, max_tokens=25, max_token_id=10)  # 64 tokens -> 4 blocks of 16


@pytest.mark.parametrize("prompt, max_tokens, block_size, expected", [
    (1, 1, 16, 1), (16, 1, 16, 1), (16, 2, 16, 2), (17, 1, 16, 2), (40, 25, 16, 4), (40, 26, 16, 5), (5, 5, 0, 0),
])
def test_blocks_needed_counts_prompt_plus_decode_growth_minus_the_last_token(prompt, max_tokens, block_size, expected):
    assert blocks_needed(prompt, max_tokens, block_size) == expected


def test_prefill_is_least_loaded_and_decode_has_most_headroom():
    c = cluster(worker("p0", WorkerRole.PREFILL, pending=300), worker("p1", WorkerRole.PREFILL, pending=100),
                worker("d0", WorkerRole.DECODE, free=40), worker("d1", WorkerRole.DECODE, free=90))
    p, d = choose_pair(c, DEMAND)
    assert (p.worker_id, d.worker_id) == ("p1", "d1")


def test_decode_must_share_the_prefill_cache_abi():
    c = cluster(worker("p0", WorkerRole.PREFILL, abi="abi-a"), worker("d0", WorkerRole.DECODE, abi="abi-b", free=100),
                worker("d1", WorkerRole.DECODE, abi="abi-a", free=10))
    assert choose_pair(c, DEMAND)[1].worker_id == "d1"
    assert choose_pair(cluster(worker("p0", WorkerRole.PREFILL, abi="x"), worker("d0", WorkerRole.DECODE, abi="y")),
                       DEMAND) is None


def test_next_prefill_is_tried_when_the_least_loaded_has_no_compatible_decode():
    c = cluster(worker("p0", WorkerRole.PREFILL, pending=0, abi="abi-b"), worker("p1", WorkerRole.PREFILL, pending=500),
                worker("d0", WorkerRole.DECODE))
    assert [w.worker_id for w in choose_pair(c, DEMAND)] == ["p1", "d0"]


def test_ties_break_on_worker_id_whatever_the_snapshot_order():
    ws = [worker("p1", WorkerRole.PREFILL), worker("p0", WorkerRole.PREFILL), worker("d1", WorkerRole.DECODE),
          worker("d0", WorkerRole.DECODE)]
    for order in (ws, ws[::-1]):
        assert [w.worker_id for w in choose_pair(cluster(*order), DEMAND)] == ["p0", "d0"]


def test_a_both_worker_is_never_paired_with_itself():
    c = cluster(worker("b0", WorkerRole.MIXED))
    assert choose_pair(c, DEMAND) is None
    assert choose_colocated(c, DEMAND).worker_id == "b0"
    c2 = cluster(worker("b0", WorkerRole.MIXED, free=100), worker("b1", WorkerRole.MIXED, free=50, pending=10))
    assert [w.worker_id for w in choose_pair(c2, DEMAND)] == ["b0", "b1"]


def test_workers_that_can_never_hold_the_request_are_skipped():
    small = WorkerCapacity(total_blocks=3, block_size=16, vocab_size=512, max_model_len=2048)
    c = cluster(worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE, cap=small, free=3),
                worker("d1", WorkerRole.DECODE, free=4))
    assert choose_pair(c, DEMAND)[1].worker_id == "d1"
    assert "total_blocks 3" in rejects(c.workers[1], DEMAND)
    short = WorkerCapacity(total_blocks=100, block_size=16, vocab_size=8, max_model_len=50)
    w = worker("d2", WorkerRole.DECODE, cap=short)
    assert "vocab_size 8" in rejects(w, DEMAND)
    assert "max_model_len 50" in rejects(w, Demand(40, 25, 0))


def test_fits_now_beats_lower_prefill_load_but_a_full_worker_is_still_a_last_resort():
    c = cluster(worker("p0", WorkerRole.PREFILL, pending=0), worker("p1", WorkerRole.PREFILL, pending=50, abi="abi-b"),
                worker("d0", WorkerRole.DECODE, free=2), worker("d1", WorkerRole.DECODE, free=50, abi="abi-b"))
    assert [w.worker_id for w in choose_pair(c, DEMAND)] == ["p1", "d1"]
    full = cluster(worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE, free=1),
                   worker("d1", WorkerRole.DECODE, free=3))
    assert choose_pair(full, DEMAND)[1].worker_id == "d1"  # heartbeats lag: the worker decides


def test_avoided_workers_lose_to_any_alternative_but_are_used_when_alone():
    c = cluster(worker("p0", WorkerRole.PREFILL), worker("p1", WorkerRole.PREFILL, pending=999),
                worker("d0", WorkerRole.DECODE, free=100), worker("d1", WorkerRole.DECODE, free=5))
    assert [w.worker_id for w in choose_pair(c, DEMAND, avoid={"p0", "d0"})] == ["p1", "d1"]
    assert [w.worker_id for w in choose_pair(c, DEMAND, avoid={"p0"})] == ["p1", "d0"]
    lonely = cluster(worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE),
                     worker("d1", WorkerRole.DECODE, free=5))
    assert [w.worker_id for w in choose_pair(lonely, DEMAND, avoid={"p0", "d0"})] == ["p0", "d1"]
    assert choose_colocated(lonely, DEMAND, avoid={"d0", "d1"}).worker_id == "d0"


def test_tried_pairs_are_never_chosen_again():
    c = cluster(worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE),
                worker("d1", WorkerRole.DECODE, free=5))
    assert choose_pair(c, DEMAND, tried={("p0", "d0")})[1].worker_id == "d1"
    assert choose_pair(c, DEMAND, tried={("p0", "d0"), ("p0", "d1")}) is None


def test_colocated_picks_most_headroom_among_decode_capable_workers():
    c = cluster(worker("p0", WorkerRole.PREFILL, free=1000), worker("d0", WorkerRole.DECODE, free=10),
                worker("b0", WorkerRole.MIXED, free=60), worker("d1", WorkerRole.DECODE, free=60, batch=3))
    assert choose_colocated(c, DEMAND).worker_id == "b0"
    assert choose_colocated(cluster(worker("p0", WorkerRole.PREFILL)), DEMAND) is None


def test_a_worker_without_a_heartbeat_counts_its_declared_capacity_as_free():
    w = WorkerRecord("d0", WorkerRole.DECODE, "d0:1", capacity=CAP)  # load all zero
    assert free_blocks(w) == 100


def test_overlay_counts_dispatches_so_concurrent_requests_spread():
    overlay = LoadOverlay()
    c = cluster(worker("p0", WorkerRole.PREFILL), worker("p1", WorkerRole.PREFILL, pending=10),
                worker("d0", WorkerRole.DECODE, free=50), worker("d1", WorkerRole.DECODE, free=48))
    p, d = choose_pair(c, DEMAND, overlay)
    assert (p.worker_id, d.worker_id) == ("p0", "d0")
    overlay.add(p, prefill_tokens=40)
    overlay.add(d, blocks=4)
    assert pending_prefill_tokens(p, overlay) == 40 and free_blocks(d, overlay) == 46
    assert [w.worker_id for w in choose_pair(c, DEMAND, overlay)] == ["p1", "d1"]


def test_overlay_entry_lives_until_a_heartbeat_newer_than_the_dispatch():
    overlay = LoadOverlay(ttl_s=1000)
    d = worker("d0", WorkerRole.DECODE, lease=1000)
    overlay.observe(cluster(d), overlay.fetch_started())           # snapshot A (before dispatch)
    handle = overlay.add(d, blocks=4)
    # Snapshot B started after the dispatch but shows the same heartbeat as A.
    overlay.observe(cluster(d), overlay.fetch_started())
    assert overlay.blocks("d0") == 4
    # Snapshot C shows a new heartbeat; B, read after the dispatch, still had the
    # old one, so the heartbeat is newer than the dispatch and counts it.
    overlay.observe(cluster(worker("d0", WorkerRole.DECODE, lease=2000)), overlay.fetch_started())
    assert overlay.blocks("d0") == 0
    overlay.remove(handle)  # idempotent


def test_a_dispatch_a_heartbeat_showed_is_given_back_when_it_ends_until_a_newer_heartbeat():
    """A worker's last report taken while it held a request: once the request ends, its
    blocks and prompt tokens count as free again until a heartbeat newer than the end."""
    overlay = LoadOverlay(ttl_s=1000)
    d = worker("d0", WorkerRole.DECODE, free=40, lease=1000)
    overlay.observe(cluster(d), overlay.fetch_started())
    blocks, tokens = overlay.add(d, blocks=4), overlay.add(d, prefill_tokens=30)
    overlay.observe(cluster(d), overlay.fetch_started())
    shown = worker("d0", WorkerRole.DECODE, free=36, pending=30, lease=2000)  # the report holds them
    overlay.observe(cluster(shown), overlay.fetch_started())
    assert (free_blocks(shown, overlay), pending_prefill_tokens(shown, overlay)) == (36, 30)
    assert len(overlay) == 2
    overlay.remove(blocks)
    overlay.remove(tokens)
    overlay.remove(blocks)  # idempotent: given back once
    assert (free_blocks(shown, overlay), pending_prefill_tokens(shown, overlay)) == (40, 0)
    assert overlay.totals() == {"d0": (-30, -4, -1)} and len(overlay) == 0
    overlay.observe(cluster(shown), overlay.fetch_started())  # the same report: still given back
    assert free_blocks(shown, overlay) == 40
    fresh = worker("d0", WorkerRole.DECODE, free=40, lease=3000)  # a heartbeat, read after the end, shows it
    overlay.observe(cluster(fresh), overlay.fetch_started())
    assert (free_blocks(fresh, overlay), overlay.totals()) == (40, {})


def test_a_dispatch_that_ends_before_any_heartbeat_showed_it_is_just_dropped():
    overlay = LoadOverlay(ttl_s=1000)
    d = worker("d0", WorkerRole.DECODE, free=40, lease=1000)
    overlay.observe(cluster(d), overlay.fetch_started())
    overlay.remove(overlay.add(d, blocks=4))
    overlay.observe(cluster(worker("d0", WorkerRole.DECODE, free=40, lease=2000)), overlay.fetch_started())
    assert overlay.totals() == {} and free_blocks(d, overlay) == 40


def test_given_back_blocks_never_raise_free_blocks_above_the_total_and_expire():
    now = [0.0]
    overlay = LoadOverlay(ttl_s=5.0, clock=lambda: now[0])
    d = worker("d0", WorkerRole.DECODE, free=98, lease=1000)  # CAP: 100 blocks in all
    overlay.observe(cluster(d), overlay.fetch_started())
    handle = overlay.add(d, blocks=4)
    overlay.observe(cluster(d), overlay.fetch_started())
    overlay.observe(cluster(worker("d0", WorkerRole.DECODE, free=98, lease=2000)), overlay.fetch_started())
    now[0] = 10.0  # a long request: the heartbeat-shown hold outlives the TTL
    assert overlay.blocks("d0") == 0 and len(overlay) == 1
    overlay.remove(handle)
    assert free_blocks(d, overlay) == 100  # 98 + 4, at most the total
    now[0] = 15.1
    assert overlay.blocks("d0") == 0  # given back for the TTL after the end at most


def test_a_planned_hold_is_never_given_back():
    overlay = LoadOverlay(ttl_s=1000)
    d = worker("d0", WorkerRole.DECODE, free=40, lease=1000)
    overlay.observe(cluster(d), overlay.fetch_started())
    handle = overlay.add(d, blocks=4, planned=True)
    overlay.observe(cluster(d), overlay.fetch_started())
    overlay.observe(cluster(worker("d0", WorkerRole.DECODE, free=40, lease=2000)), overlay.fetch_started())
    overlay.remove(handle)  # a plan was never on the worker: nothing to give back
    assert overlay.totals() == {}


def test_overlay_keeps_an_entry_when_the_heartbeat_may_predate_the_dispatch():
    overlay = LoadOverlay(ttl_s=1000)
    fetch = overlay.fetch_started()              # snapshot A's read is in flight ...
    overlay.add(worker("d0", WorkerRole.DECODE), blocks=4)  # ... when the router dispatches
    overlay.observe(cluster(worker("d0", WorkerRole.DECODE, lease=1000)), fetch)
    overlay.observe(cluster(worker("d0", WorkerRole.DECODE, lease=2000)), overlay.fetch_started())
    assert overlay.blocks("d0") == 4  # the heartbeat could be older than the dispatch
    overlay.observe(cluster(worker("d0", WorkerRole.DECODE, lease=3000)), overlay.fetch_started())
    assert overlay.blocks("d0") == 0


def test_overlay_drops_entries_of_reregistered_or_departed_workers_and_late_snapshots():
    overlay = LoadOverlay(ttl_s=1000)
    d0, d1 = worker("d0", WorkerRole.DECODE), worker("d1", WorkerRole.DECODE)
    overlay.add(d0, blocks=4)
    overlay.add(d1, blocks=2)
    old = overlay.fetch_started()
    overlay.observe(cluster(worker("d0", WorkerRole.DECODE, epoch=2), d1), overlay.fetch_started())
    assert (overlay.blocks("d0"), overlay.blocks("d1")) == (0, 2)
    overlay.observe(cluster(), old)  # a slower, older fetch must not clear anything
    assert overlay.blocks("d1") == 2
    overlay.observe(cluster(), overlay.fetch_started())
    assert len(overlay) == 0


def test_overlay_entries_expire_after_the_ttl():
    now = [0.0]
    overlay = LoadOverlay(ttl_s=5.0, clock=lambda: now[0])
    overlay.add(worker("p0", WorkerRole.PREFILL), prefill_tokens=40)
    now[0] = 4.9
    assert overlay.prefill_tokens("p0") == 40
    now[0] = 5.1
    assert overlay.prefill_tokens("p0") == 0


def test_capacity_shortfall_names_the_numbers():
    small = WorkerCapacity(total_blocks=3, block_size=16)
    c = [worker("d0", WorkerRole.DECODE, cap=small),
         worker("d1", WorkerRole.DECODE, cap=WorkerCapacity(total_blocks=2, block_size=16))]
    msg = capacity_shortfall(c, DEMAND)
    assert "needs 4 K/V blocks of 16 tokens" in msg and "40 + max_tokens 25 - 1 = 64" in msg
    assert "(d0) has only 3 blocks" in msg
    assert capacity_shortfall(c, Demand(10, 10)) is None
    assert capacity_shortfall([worker("d0", WorkerRole.DECODE, cap=WorkerCapacity())], DEMAND) is None


def test_penalties_weigh_certain_failures_above_suspicions():
    c = cluster(worker("d0", WorkerRole.DECODE, free=100), worker("d1", WorkerRole.DECODE, free=50))
    assert choose_colocated(c, DEMAND, avoid={"d0": 2, "d1": 1}).worker_id == "d1"
    assert choose_colocated(c, DEMAND, avoid={"d0": 1, "d1": 1}).worker_id == "d0"


def test_failure_memory_forgets_after_the_cooldown_or_a_new_epoch():
    now = [0.0]
    memory = FailureMemory(cooldown_s=3.0, clock=lambda: now[0])
    d0 = worker("d0", WorkerRole.DECODE)
    memory.record(d0)
    assert memory.penalties(cluster(d0)) == {"d0": 2}
    assert memory.penalties(cluster(worker("d0", WorkerRole.DECODE, epoch=2))) == {}  # re-registered: clean
    now[0] = 3.5
    assert memory.penalties(cluster(d0)) == {}
