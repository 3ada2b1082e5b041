"""Every block a worker holds has an owner and a way back (docs/design.md, Principles).

Prefill: a prefill whose caller vanished without cancelling (it waits on a peer
that never answers) is cancelled at its TTL and its blocks freed. Decode: a
published sequence that no DecodeStream ever claims is stopped at the TTL.
Block accounting (`block_counts`) covers every held block: free + reserved +
active == total. In-process fakes stand in for the sender, receiver and
directory (unit level); the fault suite runs the same paths on real processes.
"""

from __future__ import annotations

import asyncio

import pytest

from prefill_worker.worker import PrefillWorker
from runtime.directory.states import Outcome, TxnState
from runtime.engine import SamplingParams
from runtime.transfer import KVSender
from runtime.transfer.chunks import chunk_bytes, plan_chunks
from runtime.worker.config import WorkerConfig
from runtime.worker.loop import EngineLoop
from runtime.worker.process import block_counts
from tests.support.engine import assert_no_leak, running_loop, tiny_engine

PROMPT = list(range(3, 103))


class _Reply:
    def __init__(self, outcome=Outcome.APPLIED):
        self.outcome, self.state = outcome, TxnState.TRANSFERRING

    @property
    def ok(self):
        return self.outcome.ok


class FakeTxn:
    worker_id = "p0"

    def __init__(self):
        self.aborts: list[tuple[str, str]] = []

    def epoch_fn(self):
        return 1

    async def begin(self, request_id, transfer_id, generation, kv_digest="", chunks=()):
        return _Reply()

    def seal(self, transfer_id, generation, evidence):
        return b""

    async def abort(self, request_id, transfer_id, generation, reason):
        self.aborts.append((transfer_id, reason))


class SilentPeer(KVSender):
    """A destination that accepts the connection and never answers a chunk."""

    def __init__(self):
        self.aborted: list[str] = []
        self.sending = asyncio.Event()

    async def start(self):
        pass

    async def send(self, dest, transfer_id, chunk, views):
        self.sending.set()
        await asyncio.Future()

    async def present(self, dest, transfer_id, credential, key=b"", confirm=False):
        pass

    async def commit(self, dest, commit):
        await asyncio.Future()

    async def abort(self, dest, transfer_id, reason):
        self.aborted.append(transfer_id)

    async def close(self):
        pass


@pytest.fixture
def loop():
    yield from running_loop(num_blocks=64)


def test_a_prefill_stuck_on_a_silent_peer_is_cancelled_at_its_ttl(loop):
    cfg = WorkerConfig(prefill_ttl_s=0.5, stream_layers=False)
    peer, txn = SilentPeer(), FakeTxn()
    worker = PrefillWorker(cfg, loop, peer, txn)
    seen = {}

    async def go():
        run = asyncio.ensure_future(worker.prefill(
            request_id="r", tenant="t", generation=1, transfer_id="r/1", first_token_pos=0,
            prompt=PROMPT, sampling=SamplingParams(), dest="nowhere", abi_digest="",
            chunks=[(k.layer, k.block_start, k.block_count, chunk_bytes(loop.engine, k))
                    for k in plan_chunks(loop.engine.model_cfg.num_hidden_layers, 0, 7, 16)]))
        await asyncio.wait_for(peer.sending.wait(), 10)
        seen["while_stuck"] = block_counts(loop.engine)
        seen["held"] = worker.held_blocks()
        with pytest.raises(asyncio.CancelledError) as err:
            await asyncio.wait_for(run, 10)
        seen["error"] = str(err.value)
        for _ in range(100):  # the free is a queued engine-loop call
            await loop.call(lambda e: None)
            if loop.engine.num_free_blocks == loop.engine.blocks.num_blocks:
                break
            await asyncio.sleep(0.01)

    asyncio.run(go())
    c = seen["while_stuck"]
    assert c["active_blocks"] == seen["held"] == 7 and c["reserved_blocks"] == 0  # 100 tokens / 16
    assert c["free_blocks"] + c["active_blocks"] == c["total_blocks"] == 64
    assert "TTL" in seen["error"]
    assert peer.aborted == ["r/1"] and txn.aborts and txn.aborts[0][0] == "r/1"
    assert worker.tasks == {}
    assert_no_leak(loop.engine)
    after = block_counts(loop.engine)
    assert after["active_blocks"] == 0 and after["cached_blocks"] == 6  # full prompt blocks stay as prefix cache


class FakeDecodeTxn(FakeTxn):
    worker_id = "d0"

    def __init__(self):
        super().__init__()
        self.released: list[str] = []
        self.published: list[str] = []

    async def publish(self, request_id, transfer_id, generation, digest, chunks=(), source_seal=b""):
        self.published.append(transfer_id)
        return _Reply()

    async def release(self, request_id, transfer_id, generation):
        self.released.append(transfer_id)


def _on_a_split_pair(receiver_name: str, body) -> None:
    """Run `await body(decode, prefill, receiver, txn)` on a tiny decode and prefill worker
    over the inproc data plane (reservation TTL 0.5 s), then check neither engine leaked a
    block."""
    from decode_worker.worker import DecodeWorker
    from runtime.transfer.inproc import InprocReceiver, InprocSender

    p_loop, d_loop = EngineLoop(tiny_engine(num_blocks=64)), EngineLoop(tiny_engine(num_blocks=256))
    p_loop.start()
    d_loop.start()
    cfg = WorkerConfig(reservation_ttl_s=0.5, stream_layers=False, transport="inproc")

    async def go():
        receiver = InprocReceiver(receiver_name)
        await receiver.start()
        txn = FakeDecodeTxn()
        try:
            await body(DecodeWorker(cfg, d_loop, receiver, txn), PrefillWorker(cfg, p_loop, InprocSender(), FakeTxn()),
                       receiver, txn)
            for _ in range(500):  # the frees are queued engine-loop calls
                await p_loop.call(lambda e: None)
                await d_loop.call(lambda e: None)
                if all(lp.engine.num_free_blocks == lp.engine.blocks.num_blocks for lp in (p_loop, d_loop)):
                    break
                await asyncio.sleep(0.01)
        finally:
            await receiver.stop()

    try:
        asyncio.run(go())
    finally:
        p_loop.stop()
        d_loop.stop()
    assert_no_leak(d_loop.engine)
    assert_no_leak(p_loop.engine)


def _send(prefill, receiver, res, sampling):
    return prefill.prefill(request_id="r", tenant="t", generation=1, transfer_id="r/1", first_token_pos=0,
                           prompt=PROMPT, sampling=sampling, dest=receiver.address, abi_digest="",
                           chunks=res.expected_layouts())


def test_a_published_sequence_nobody_streams_is_stopped_at_the_ttl():
    """The router's DecodeStream came (the decode may publish), then the router died before
    the commit: the published sequence would decode to max_tokens holding its blocks; the
    TTL stops it and frees them."""
    seen = {}

    async def body(decode, prefill, receiver, txn):
        sampling = SamplingParams(ignore_eos=True)
        res = await decode.reserve("r", "t", 1, PROMPT, 1900, sampling, "")
        gone = asyncio.ensure_future(anext(decode.stream("r/1")))  # the router's stream, then the router dies
        while not res.streamed:
            await asyncio.sleep(0.001)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        await _send(prefill, receiver, res, sampling)
        seen["decoding"] = block_counts(decode.engine, decode.reserved_blocks())
        for _ in range(300):
            await asyncio.sleep(0.05)
            if txn.released:
                break
        seen["released"] = list(txn.released)
        seen["steps"] = decode.loop.steps
        with pytest.raises(RuntimeError, match="no DecodeStream came within 0.5 s"):  # a late stream
            async for _ in decode.stream("r/1"):
                pass

    _on_a_split_pair("d0-unclaimed", body)
    assert seen["decoding"]["active_blocks"] > 0 and seen["decoding"]["reserved_blocks"] == 0
    assert seen["released"] == ["r/1"]
    assert seen["steps"] < 1900  # stopped long before max_tokens


def test_without_the_routers_stream_nothing_is_published_and_everything_comes_back():
    """The router died before its DecodeStream (which it sends once the directory recorded
    the transfer): the decode publishes nothing; the prefill's COMMIT is refused at the
    reservation TTL and both sides' blocks come back."""
    from decode_worker.reservations import ResState
    from prefill_worker.handoff import TransferRefused

    async def body(decode, prefill, receiver, txn):
        sampling = SamplingParams(ignore_eos=True)
        res = await decode.reserve("r", "t", 1, PROMPT, 8, sampling, "")
        with pytest.raises(TransferRefused, match="no DecodeStream within the reservation TTL"):
            await _send(prefill, receiver, res, sampling)
        assert res.state is ResState.ABORTED and txn.published == []

    _on_a_split_pair("d0-no-stream", body)
