"""Chunking (chunks.py), the in-process backend, and the backend factory.

The flow under test is a decode engine B receiving a prompt's K/V from a
prefill engine A in the same process:

    B: reserve into a fragmented pool (runs of 3 physical blocks), unlike A's
    A: prefill -> describe_chunk/chunk_views per planned key -> send -> commit
    B: every chunk arrived with the manifest's checksum, kv_digest equal
       -> commit_import -> decode; tokens equal A continuing itself
Every test ends with both pools full again and the receiver holding nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import Counter

import pytest
import torch

from runtime.engine import SamplingParams, export_kv
from runtime.transfer import (
    ChunkArrived,
    ChunkKey,
    Expectation,
    Failed,
    TransferCommit,
    TransferError,
    TransferKey,
    Verdict,
    chunk_checksum,
)
from runtime.transfer.chunks import chunk_bytes, chunk_views, describe_chunk, plan_chunks
from runtime.transfer.factory import make_receiver, make_sender
from runtime.transfer.inproc import InprocReceiver, InprocSender
from runtime.transfer.tcp import TcpReceiver, TcpSender
from tests.support.engine import assert_no_leak, random_prompt, tiny_engine

GREEDY = SamplingParams(ignore_eos=True)
MAX_TOKENS = 9
LAYERS = 4  # tiny preset


# ---- chunks.py ---------------------------------------------------------------------


@pytest.mark.parametrize("layers,first,last,per_chunk", [
    (4, 0, 7, 3), (4, 0, 1, 1), (2, 3, 10, 64), (3, 2, 2, 4), (1, 0, 12, 4), (4, 5, 6, 2)])
def test_plan_chunks_covers_every_cell_exactly_once(layers, first, last, per_chunk):
    keys = plan_chunks(layers, first, last, per_chunk)
    cells = Counter((k.layer, b) for k in keys for b in range(k.block_start,
                                                              k.block_start + k.block_count))
    assert set(cells) == {(layer, b) for layer in range(layers) for b in range(first, last)}
    assert all(n == 1 for n in cells.values())
    assert all(0 < k.block_count <= per_chunk for k in keys)
    assert [k.layer for k in keys] == sorted(k.layer for k in keys)  # layer-major
    assert len(keys) == layers * -(-(last - first) // per_chunk)


def _fragmented(engine, prompt, max_tokens=MAX_TOKENS):
    """A request whose blocks are runs of 3 physical blocks with holes between them."""
    singles = [engine.add_request(f"h{i}", [1], 1, GREEDY) for i in range(engine.blocks.num_blocks)]
    for i, s in enumerate(singles):
        if i % 4 != 3:
            engine.free(s)
    seq = engine.add_request("r", prompt, max_tokens, GREEDY)
    assert seq.block_table == [b for b in range(64) if b % 4 != 3][:len(seq.block_table)]
    return seq, [s for i, s in enumerate(singles) if i % 4 == 3]


def test_chunk_views_are_the_packed_bytes_of_the_chunk():
    engine = tiny_engine(num_blocks=32)
    prompt = random_prompt(random.Random(1), 100)  # 7 blocks
    seq, holders = _fragmented(engine, prompt)
    engine.prefill(seq)
    per_layer = engine.cache.block_bytes_per_layer
    for key in plan_chunks(LAYERS, 0, 7, 3):
        views = chunk_views(engine, seq, key)
        assert sum(v.nbytes for v in views) == chunk_bytes(engine, key)
        assert chunk_bytes(engine, key) == key.block_count * per_layer
        packed = export_kv(engine, seq, key.block_start, key.block_count)  # layer by layer
        mine = packed[key.layer * key.block_count * per_layer:][:key.block_count * per_layer]
        assert b"".join(bytes(v) for v in views) == mine
        c = describe_chunk(engine, seq, key, TransferKey.public("t"))
        assert (c.key, c.num_bytes, c.checksum) == (key, len(mine),
                                                    chunk_checksum(TransferKey.public("t"), key, [memoryview(mine)]))
    for s in [seq, *holders]:
        engine.free(s)
    assert_no_leak(engine)


def test_byte_views_write_into_the_cache_and_refuse_blocks_outside_it():
    engine = tiny_engine(num_blocks=8)
    cache = engine.cache
    k, v = cache.byte_views(2, 5, 3)  # the last 3 blocks of layer 2
    k[:] = b"\x01" * k.nbytes
    v[:] = b"\x02" * v.nbytes
    assert bytes(cache.k[2][5:8].view(torch.uint8).flatten().numpy()) == b"\x01" * k.nbytes
    assert bytes(cache.v[2][5:8].view(torch.uint8).flatten().numpy()) == b"\x02" * v.nbytes
    assert not cache.k[2][:5].any() and not cache.v[2][:5].any() and not cache.k[3].any()
    for layer, first, count in [(2, 6, 3), (LAYERS, 0, 1), (-1, 0, 1), (0, -1, 1)]:
        with pytest.raises(IndexError, match="outside the cache"):
            cache.byte_views(layer, first, count)


# ---- inproc backend ----------------------------------------------------------------


class Decode:
    """Receiver-side bookkeeping of one expected transfer (what a decode worker keeps)."""

    def __init__(self, engine, seq, first_block: int, last_block: int):
        self.engine, self.seq = engine, seq
        self.first_block, self.last_block = first_block, last_block
        self.events: list = []
        self.verdicts: list[Verdict] = []

    def resolve(self, key: ChunkKey):
        if not (0 <= key.layer < LAYERS and self.first_block <= key.block_start
                and key.block_start + key.block_count <= self.last_block and key.block_count > 0):
            raise KeyError(f"{key} outside the transfer set")
        return chunk_views(self.engine, self.seq, key)

    async def on_commit(self, commit: TransferCommit) -> Verdict:
        arrived = {e.key: e.checksum for e in self.events if isinstance(e, ChunkArrived)}
        if arrived != {c.key: c.checksum for c in commit.chunks}:
            verdict = Verdict(False, "chunks differ from the manifest")
        elif self.engine.kv_digest(self.seq) != commit.kv_digest:
            verdict = Verdict(False, "kv digest differs")
        else:
            self.engine.commit_import(self.seq, commit.first_token)
            verdict = Verdict(True)
        self.verdicts.append(verdict)
        return verdict

    def expectation(self, transfer_id: str) -> Expectation:
        return Expectation(transfer_id, self.resolve, self.events.append, self.on_commit)

    @property
    def failures(self) -> list[str]:
        return [e.reason for e in self.events if isinstance(e, Failed)]


def _pair(prompt):
    """Prefill engine A (prompt computed) and decode engine B (fragmented reservation)."""
    a, b = tiny_engine(num_blocks=32), tiny_engine(num_blocks=32)
    sa = a.add_request("r", prompt, MAX_TOKENS, GREEDY)
    first = a.prefill(sa)
    sb, holders = _fragmented(b, prompt)
    n_blocks = -(-len(prompt) // a.block_size)
    return a, sa, first, b, sb, holders, Decode(b, sb, 0, n_blocks)


async def _send_all(sender, dest, tid, engine, seq, keys):
    chunks = []
    for key in keys:
        c = describe_chunk(engine, seq, key, TransferKey.public(tid))
        await sender.send(dest, tid, c, chunk_views(engine, seq, key))
        chunks.append(c)
    return tuple(chunks)


@pytest.mark.parametrize("prompt_len,per_chunk", [(9, 1), (100, 3), (100, 64)])
def test_flow_between_two_engines_is_exact(prompt_len, per_chunk):
    prompt = random_prompt(random.Random(prompt_len), prompt_len)
    a, sa, first, b, sb, holders, dec = _pair(prompt)

    async def run():
        recv, send = InprocReceiver("decode-b"), InprocSender()
        await recv.start()
        recv.expect(dec.expectation("t1"))
        keys = plan_chunks(LAYERS, 0, dec.last_block, per_chunk)
        chunks = await _send_all(send, recv.address, "t1", a, sa, keys)
        verdict = await send.commit(recv.address, TransferCommit(
            "t1", "r", 1, a.abi.digest, chunks, a.kv_digest(sa), first))
        assert recv.pending == {}
        await recv.stop()
        return verdict

    assert asyncio.run(run()) == Verdict(True)
    assert b.kv_digest(sb) == a.kv_digest(sa)
    if dec.last_block > 3:  # B's 4th block sits after a hole, A's does not
        assert sb.block_table[:dec.last_block] != sa.block_table[:dec.last_block]
    for engine, seq in ((a, sa), (b, sb)):
        while not seq.is_finished:
            engine.decode_step([seq])
    assert sb.output_ids == sa.output_ids and len(sa.output_ids) == MAX_TOKENS
    for engine, seq in ((a, sa), (b, sb), *((b, h) for h in holders)):
        engine.free(seq)
    assert_no_leak(a)
    assert_no_leak(b)


def _run_faulty(body):
    """Run body(a, sa, first, recv, sender, dec) against an expected transfer t1, then clean up."""
    prompt = random_prompt(random.Random(3), 60)  # 4 blocks: physical 0, 1, 2, 4
    a, sa, first, b, sb, holders, dec = _pair(prompt)

    async def run():
        recv, send = InprocReceiver("decode-faulty"), InprocSender()
        await recv.start()
        recv.expect(dec.expectation("t1"))
        await body(a, sa, first, recv, send, dec)
        await recv.stop()
        return recv

    recv = asyncio.run(run())
    assert recv.pending == {}
    for engine, seq in ((a, sa), (b, sb), *((b, h) for h in holders)):
        engine.free(seq)
    assert_no_leak(a)
    assert_no_leak(b)
    return dec


def test_unexpected_transfer_is_refused_and_writes_nothing():
    async def body(a, sa, first, recv, send, dec):
        before = dec.engine.kv_digest(dec.seq)
        key = ChunkKey(0, 0, 1)
        with pytest.raises(TransferError, match="not expected"):
            await send.send(recv.address, "ghost", describe_chunk(a, sa, key, TransferKey.public("ghost")),
                            chunk_views(a, sa, key))
        verdict = await send.commit(recv.address, TransferCommit(
            "ghost", "r", 1, a.abi.digest, (), "", first))
        assert not verdict.published and "not expected" in verdict.reason
        assert dec.engine.kv_digest(dec.seq) == before and dec.events == []
        recv.forget("t1")

    _run_faulty(body)


def test_chunk_outside_the_transfer_set_fails_the_transfer():
    async def body(a, sa, first, recv, send, dec):
        good = describe_chunk(a, sa, ChunkKey(0, 0, 1), TransferKey.public("t1"))
        bad = dataclasses.replace(good, key=ChunkKey(0, dec.last_block, 1))
        with pytest.raises(TransferError):
            await send.send(recv.address, "t1", bad, chunk_views(a, sa, ChunkKey(0, 0, 1)))
        assert "t1" not in recv.pending

    dec = _run_faulty(body)
    assert len(dec.failures) == 1 and "unexpected chunk" in dec.failures[0]


def test_chunk_of_the_wrong_size_fails_the_transfer():
    async def body(a, sa, first, recv, send, dec):
        c = describe_chunk(a, sa, ChunkKey(1, 0, 2), TransferKey.public("t1"))
        short = [memoryview(b"".join(bytes(v) for v in chunk_views(a, sa, c.key))[:-4])]
        with pytest.raises(TransferError, match="size"):
            await send.send(recv.address, "t1", c, short)

    dec = _run_faulty(body)
    assert len(dec.failures) == 1 and "expected" in dec.failures[0]


def test_forget_stops_writes_and_emits_nothing():
    async def body(a, sa, first, recv, send, dec):
        keys = plan_chunks(LAYERS, 0, dec.last_block, 1)
        await _send_all(send, recv.address, "t1", a, sa, keys[:2])
        recv.forget("t1")
        recv.forget("t1")  # idempotent
        await recv.fence("t1")
        frozen = dec.engine.kv_digest(dec.seq)
        with pytest.raises(TransferError, match="not expected"):
            await _send_all(send, recv.address, "t1", a, sa, keys[2:])
        verdict = await send.commit(recv.address, TransferCommit(
            "t1", "r", 1, a.abi.digest, (), a.kv_digest(sa), first))
        assert not verdict.published
        assert dec.engine.kv_digest(dec.seq) == frozen

    dec = _run_faulty(body)
    assert [type(e) for e in dec.events] == [ChunkArrived, ChunkArrived] and dec.verdicts == []


def test_abort_and_stop_fail_pending_transfers():
    async def body(a, sa, first, recv, send, dec):
        await send.abort(recv.address, "t1", "prefill cancelled")
        await send.abort(recv.address, "t1", "again")  # no longer pending: nothing
        await send.abort("inproc://nobody", "t1", "never raises")
        recv.expect(dec.expectation("t2"))
        await recv.stop()

    dec = _run_faulty(body)
    assert dec.failures == ["aborted by sender: prefill cancelled", "receiver stopped"]


def test_commit_rejected_by_the_receiver_is_a_verdict_not_an_error():
    async def body(a, sa, first, recv, send, dec):
        keys = plan_chunks(LAYERS, 0, dec.last_block, 2)
        chunks = await _send_all(send, recv.address, "t1", a, sa, keys)
        verdict = await send.commit(recv.address, TransferCommit(
            "t1", "r", 1, a.abi.digest, chunks[:-1], a.kv_digest(sa), first))
        assert verdict == Verdict(False, "chunks differ from the manifest")
        assert recv.pending == {}

    _run_faulty(body)


# ---- factory -----------------------------------------------------------------------


def test_factory_builds_each_backend_and_names_the_known_ones():
    assert make_receiver("inproc", name="d1").address == "inproc://d1"
    assert make_receiver("inproc").address != make_receiver("inproc").address
    assert isinstance(make_sender("inproc"), InprocSender)
    tcp = make_receiver("tcp", host="127.0.0.1", idle_timeout_s=3.0)
    assert isinstance(tcp, TcpReceiver) and tcp.idle_timeout_s == 3.0
    assert isinstance(make_sender("tcp", io_timeout_s=2.0), TcpSender)
    from runtime.transfer.ucx import UcxReceiver  # constructing starts no UCX
    ucx = make_receiver("ucx", idle_timeout_s=4.0)
    assert isinstance(ucx, UcxReceiver) and ucx.idle_timeout_s == 4.0
    assert make_sender("ucx", window_bytes=1 << 20).window_bytes == 1 << 20
    for make in (make_receiver, make_sender):
        with pytest.raises(ValueError, match=r"known: \['inproc', 'tcp', 'ucx'\]"):
            make("carrier-pigeon")
