"""Who holds which blocks (runtime/worker/holdings.py): every block of the pool is
free, cached prefix or charged to exactly one holding, and a holding names its
request, tenant, transfer, generation and state. In-process, on a tiny engine."""

from __future__ import annotations

import asyncio

import pytest

from runtime.engine import SamplingParams
from runtime.worker import holdings
from runtime.worker.blocks import view_to_pb
from runtime.worker.holdings import HoldState
from tests.support.engine import assert_no_leak, running_loop, tiny_engine

PROMPT = list(range(3, 103))  # 100 tokens: 6 full blocks of 16 and a partial one


def _add(engine, transfer_id, prompt=PROMPT, max_tokens=4, tenant="acme"):
    return engine.add_request(transfer_id, prompt, max_tokens, SamplingParams(), salt=tenant.encode())


def _adds_up(v: holdings.BlockView) -> None:
    assert v.free + v.cached_prefix + v.reserved + v.active == v.total


def test_a_reservation_is_named_and_every_block_counted_once():
    engine = tiny_engine()
    seq = _add(engine, "r1/2")
    claims = {id(seq): (HoldState.RESERVED, HoldState.RESERVED)}
    v = holdings.view(holdings.take(engine), claims)
    (h,) = v.holdings
    assert (h.request_id, h.tenant, h.transfer_id, h.generation, h.state) == \
        ("r1", "acme", "r1/2", 2, HoldState.RESERVED)
    assert h.block_ids == tuple(seq.block_table) and h.charged == len(seq.block_table) == 7
    assert h.age_s >= 0.0
    assert (v.reserved, v.active, v.free, v.cached_prefix) == (7, 0, 121, 0)
    _adds_up(v)


def test_a_shared_prefix_block_is_charged_to_the_oldest_holding_and_cached_ones_to_nobody():
    engine = tiny_engine()
    first = _add(engine, "a/1")
    engine.prefill(first)  # registers its 6 full prompt blocks as prefix cache
    second = _add(engine, "b/1")
    assert seq_shares(first, second) == 6
    claims = {id(first): (HoldState.PREFILLING, HoldState.DECODING),
              id(second): (HoldState.PUBLISHED, HoldState.DECODING)}
    v = holdings.view(holdings.take(engine), claims)
    a, b = v.holdings
    assert (a.request_id, a.state, a.charged) == ("a", HoldState.DECODING, len(first.block_table))
    assert (b.request_id, b.state, len(b.block_ids), b.charged) == ("b", HoldState.PUBLISHED, 7, 1)
    _adds_up(v)
    engine.free(first)
    engine.free(second)
    v = holdings.view(holdings.take(engine), {})
    assert v.holdings == () and v.cached_prefix == 6 and v.free == 122
    _adds_up(v)
    assert_no_leak(engine)


def seq_shares(a, b) -> int:
    return len(set(a.block_table) & set(b.block_table))


def test_a_sequence_no_record_claims_is_unowned_and_still_named():
    engine = tiny_engine()
    _add(engine, "lost/3", tenant="t9")
    (h,) = holdings.view(holdings.take(engine), {}).holdings
    assert (h.request_id, h.tenant, h.generation, h.state) == ("lost", "t9", 3, HoldState.UNOWNED)


def test_blocks_no_sequence_lists_are_one_nameless_unowned_holding():
    engine = tiny_engine()
    table, _ = engine.blocks.allocate([], 0, 3)  # taken behind the engine's back
    v = holdings.view(holdings.take(engine), {})
    (h,) = v.holdings
    assert (h.request_id, h.state, h.block_ids, h.charged) == ("", HoldState.UNOWNED, tuple(table), 3)
    _adds_up(v)


def test_the_request_filter_keeps_the_whole_pools_counts():
    engine = tiny_engine()
    _add(engine, "x/1")
    _add(engine, "y/1")
    v = holdings.view(holdings.take(engine), {}, request_id="y")
    assert [h.request_id for h in v.holdings] == ["y"]
    assert v.active == 7  # only y's charge is listed ...
    assert v.total - v.free - v.cached_prefix == 14  # ... the pool still holds both


def test_ranges_are_runs_in_table_order():
    assert holdings.ranges([4, 5, 6, 9, 2, 3]) == [(4, 3), (9, 1), (2, 2)]
    assert holdings.ranges([]) == []


def test_the_proto_carries_counts_that_add_up():
    engine = tiny_engine()
    seq = _add(engine, "p/1")
    pb = view_to_pb(holdings.view(holdings.take(engine), {id(seq): (HoldState.PREFILLING, HoldState.SENDING)}),
                    "prefill-0", 4)
    assert pb.free_blocks + pb.cached_prefix_blocks + pb.reserved_blocks + pb.active_blocks == pb.total_blocks
    assert (pb.worker_id, pb.epoch, pb.holdings[0].request_id, pb.holdings[0].state) == ("prefill-0", 4, "p", 1)
    assert sum(r.count for r in pb.holdings[0].ranges) == pb.holdings[0].num_blocks == 7


@pytest.fixture
def engine_loop():
    yield from running_loop()


def test_taken_on_the_engine_thread_while_it_decodes(engine_loop):
    """The snapshot is one `call` on the loop: consistent with the batch it runs."""
    from runtime.worker.loop import AsyncSink, Job, SeqDone

    async def go():
        sink = AsyncSink(asyncio.get_running_loop())
        seq = await engine_loop.call(lambda e: _add(e, "live/1", max_tokens=64))
        engine_loop.submit_prefill(Job(seq, sink.on_token, sink.on_done))
        while (await sink.queue.get()).index < 2:
            pass
        snap = await engine_loop.call(holdings.take)
        v = holdings.view(snap, {id(seq): (HoldState.PREFILLING, HoldState.DECODING)})
        engine_loop.cancel(seq)
        while not isinstance(await sink.queue.get(), SeqDone):
            pass
        assert (await engine_loop.call(holdings.take)).sequences == ()
        return v

    v = asyncio.run(go())
    (h,) = v.holdings
    assert (h.request_id, h.state) == ("live", HoldState.DECODING)
    _adds_up(v)
