"""The two workers below the full cluster: real PrefillWorker and
DecodeWorker on tiny engines, the inproc data plane, the real directory servicer
over the memory store (tests/support/inproc_cluster.py). A hand-off driven in the router's
order equals a colocated run, and every test ends with everything returned."""

from __future__ import annotations

import asyncio
import random

import pytest

from decode_worker.reservations import ResState
from prefill_worker.handoff import TransferRefused
from prefill_worker.worker import Target, TaskState
from runtime.directory.states import TxnState
from runtime.engine import InvalidRequest
from runtime.security.seal import Sealer
from tests.support.inproc_cluster import GREEDY, InprocCluster

PROMPT = [random.Random(3).randrange(3, 500) for _ in range(70)]  # 5 blocks of 16


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_handoff_equals_colocated_and_gives_everything_back():
    async def go():
        async with InprocCluster() as c:
            tokens, outcome = await c.handoff("r", PROMPT, 6)
            reference = await c.colocated("ref", PROMPT, 6)
            await c.assert_all_returned()  # the release may follow the stream's end
            record = await c.directory.lookup("r", "r/1")
            return tokens, reference, outcome, record

    tokens, reference, outcome, record = run(go())
    assert tokens == reference and len(tokens) == 6
    assert outcome.first_token == tokens[0] and outcome.sent_chunks > 0
    assert record.state is TxnState.RELEASED  # decode released it when the sequence ended


def test_a_streamed_handoff_equals_colocated_and_gives_everything_back():
    """Layer streaming (chunks leave as their layer is written, so the commit lists them
    in another order than the manifest; the digest is declared while they stream)."""
    prompt = [random.Random(5).randrange(3, 500) for _ in range(600)]  # 3 prefill chunks of 256

    async def go():
        async with InprocCluster(stream_min_bytes=0, chunk_tokens=256, max_chunk_blocks=4) as c:
            tokens, outcome = await c.handoff("s", prompt, 4)
            reference = await c.colocated("ref", prompt, 4)
            await c.assert_all_returned()  # the release may follow the stream's end
            record = await c.directory.lookup("s", "s/1")
            return tokens, reference, outcome, record

    tokens, reference, outcome, record = run(go())
    assert tokens == reference
    assert outcome.sent_chunks == 4 * 10  # tiny: 4 layers x 38 blocks in chunks of 4
    assert record.state is TxnState.RELEASED and record.kv_digest == outcome.kv_digest


def test_the_second_request_reuses_the_prefix_at_both_ends():
    async def go():
        async with InprocCluster() as c:
            await c.handoff("a", PROMPT, 2)
            tokens, outcome = await c.handoff("b", PROMPT + [7, 8], 3)
            reference = await c.colocated("ref", PROMPT + [7, 8], 3)
            await c.assert_all_returned()
            return tokens, reference, outcome

    tokens, reference, outcome = run(go())
    assert tokens == reference
    assert outcome.reused_tokens == 64  # 4 full blocks of the shared prompt stayed cached at P


def test_a_cancelled_prefill_aborts_the_transaction_and_frees_both_ends():
    async def go():
        async with InprocCluster(fault_pause_s=30.0) as c:  # "@computed": the prefill waits there
            res = await c.reserve("x@computed", PROMPT, 4)
            prefill = asyncio.ensure_future(c.send("x@computed", res, PROMPT))
            while "x@computed/1" not in c.prefill.tasks or \
                    c.prefill.tasks["x@computed/1"].state is not TaskState.COMPUTING:
                await asyncio.sleep(0.01)
            task = c.prefill.tasks["x@computed/1"]
            assert await c.prefill.cancel("x@computed", 1)
            with pytest.raises(asyncio.CancelledError):
                await prefill
            assert task.state is TaskState.CANCELLED
            await c.decode.cancel("x@computed", 1)  # the router's teardown reaches D too
            await c.assert_all_returned()  # the release may follow the stream's end
            record = await c.directory.lookup("x@computed", "x@computed/1")
            return record, res

    record, res = run(go())
    assert record.state is TxnState.ABORTED
    assert res.state is ResState.ABORTED


@pytest.mark.parametrize("lie", ["digest", "generation", "transfer", "key"])
def test_a_seal_that_does_not_open_over_what_the_destination_holds_publishes_nothing(lie):
    """The directory judges the bytes against the source's sealed declaration: a seal over
    another digest, another attempt or transfer, or by a key the source did not register
    (a destination forging one) does not open, and nothing is declared or published."""
    async def go():
        async with InprocCluster() as c:
            real, txn = c.p.txn.seal, c.p.txn

            def lying_seal(transfer_id, generation, evidence):
                if lie == "key":
                    return Sealer().seal(transfer_id, generation, txn.worker_id, txn.epoch_fn(), evidence)
                return real(transfer_id + "x" * (lie == "transfer"), generation + (lie == "generation"),
                            ("0" * 32 + evidence[32:]) if lie == "digest" else evidence)

            c.p.txn.seal = lying_seal
            res = await c.reserve("lie", PROMPT, 4)
            stream = c.router_stream(res)
            with pytest.raises(TransferRefused, match="directory refused VALIDATED: CHECKSUM_CONFLICT"):
                await c.send("lie", res, PROMPT)
            with pytest.raises(RuntimeError, match="aborted"):
                await stream
            await c.assert_all_returned()  # the release may follow the stream's end
            record = await c.directory.lookup("lie", "lie/1")
            return record, res

    record, res = run(go())
    assert record.state is TxnState.ABORTED and res.state is ResState.ABORTED
    assert record.kv_digest == ""  # nothing was declared


def test_bytes_changed_after_their_checksum_are_refused_by_the_directory():
    """A chunk's checksum is taken as it lands; a byte that changes afterwards (a stray
    write into the reserved blocks) changes the destination's K/V digest, and the
    directory refuses to validate it."""
    async def go():
        async with InprocCluster() as c:
            real = c.decode._on_commit

            async def corrupt_then_commit(res, commit):
                seq, engine = res.seq, c.d.loop.engine
                engine.cache.k[0][seq.block_table[0]].view(-1)[0] += 1.0
                return await real(res, commit)

            c.decode._on_commit = corrupt_then_commit
            res = await c.reserve("stray", PROMPT, 4)
            stream = c.router_stream(res)
            with pytest.raises(TransferRefused, match="CHECKSUM_CONFLICT"):
                await c.send("stray", res, PROMPT)
            with pytest.raises(RuntimeError, match="aborted"):
                await stream
            await c.assert_all_returned()
            return res

    assert run(go()).state is ResState.ABORTED


def test_a_prefill_refuses_a_chunk_list_that_is_not_the_transfer_set():
    async def go():
        async with InprocCluster() as c:
            res = await c.reserve("short", PROMPT, 4)
            with pytest.raises(InvalidRequest, match="expected_chunks"):
                await c.send("short", res, PROMPT, chunks=res.expected_layouts()[1:])
            await c.decode.cancel("short", 1)
            await c.directory.abort("short", "short/1", 1, "d0", c.d.epoch, "test over")
            await c.assert_all_returned()

    run(go())


def test_the_everything_returned_check_sees_a_held_reservation():
    async def go():
        async with InprocCluster() as c:
            await c.reserve("held", PROMPT, 4)
            with pytest.raises(AssertionError, match="not returned") as err:
                await c.assert_all_returned(timeout_s=0.2)
            await c.decode.cancel("held", 1)
            await c.directory.abort("held", "held/1", 1, "d0", c.d.epoch, "test over")
            await c.assert_all_returned()
            return str(err.value)

    message = run(go())
    assert "'d0'" in message and "held/1" in message


def test_a_discarded_handoff_leaves_the_prefix_cache():
    """The router found the two ends' digests different (Cancel with discard_kv): the
    published blocks are never a prefix hit again, even after the request finished."""
    async def go():
        async with InprocCluster() as c:
            await c.handoff("a", PROMPT, 1)
            kept = (await c.reserve("b", PROMPT + [7, 8], 2)).first_block
            await c.decode.cancel("b", 1)
            assert await c.decode.cancel("a", 1, "digest mismatch", discard_kv=True) is False  # already finished
            res = await c.reserve("c", PROMPT + [7, 8], 2)
            await c.decode.cancel("c", 1)
            await c.assert_all_returned()
            return kept, res.first_block

    kept, after = run(go())
    assert kept == 4 and after == 0  # 4 cached prompt blocks before the discard, none after


def test_a_sealed_handoff_needs_no_begin_and_publishes_at_the_first_publish():
    """Not streamed, the source declares only in its sealed COMMIT: it makes no Begin, and
    the destination's one Publish finds the transaction RESERVED and declares, validates
    and publishes it."""
    async def go():
        async with InprocCluster() as c:
            real_begin, real_publish = c.p.txn.client.begin, c.d.txn.client.publish
            begins, states = [], []

            async def publish(*args, **kw):
                before = (await c.directory.lookup(args[0], args[1])).state
                r = await real_publish(*args, **kw)
                states.append((before, r.state))
                return r

            async def begin(*args, **kw):
                begins.append(args)
                return await real_begin(*args, **kw)

            c.d.txn.client.publish, c.p.txn.client.begin = publish, begin
            tokens, outcome = await c.handoff("sealed", PROMPT, 5)
            reference = await c.colocated("ref", PROMPT, 5)
            await c.assert_all_returned()
            return tokens, reference, states, begins

    tokens, reference, states, begins = run(go())
    assert tokens == reference
    assert begins == [] and states == [(TxnState.RESERVED, TxnState.PUBLISHED)]


def test_a_destination_that_drops_the_seal_cannot_publish():
    """Without the source's seal (and no Begin declaring), the Publish finds nothing
    declared: it asks again while the transaction is RESERVED, then gives up; the
    transfer is refused and everything is returned."""
    async def go():
        async with InprocCluster() as c:
            real_publish = c.d.txn.client.publish

            async def unsealed(*args):  # (..., kv_digest, chunks, source_seal)
                return await real_publish(*args[:-1], b"")

            c.d.txn.client.publish = unsealed
            res = await c.reserve("bare", PROMPT, 4)
            stream = c.router_stream(res)
            with pytest.raises(TransferRefused, match="directory refused VALIDATED: ILLEGAL_TRANSITION"):
                await c.send("bare", res, PROMPT)
            with pytest.raises(RuntimeError, match="aborted"):
                await stream
            await c.assert_all_returned()  # the release may follow the stream's end
            record = await c.directory.lookup("bare", "bare/1")
            return record

    record = run(go())
    assert record.state is TxnState.ABORTED and record.kv_digest == ""


def _recording(sender) -> list[str]:
    """The data-plane calls `sender` makes from now on, by name."""
    calls: list[str] = []
    for name in ("present", "send", "send_many", "commit", "commit_now", "abort"):
        inner = getattr(sender, name, None)
        if inner is not None:
            def wrapped(*a, _inner=inner, _name=name, **kw):
                calls.append(_name)
                return _inner(*a, **kw)
            setattr(sender, name, wrapped)
    return calls


async def _job_then_grant(c: InprocCluster, request_id: str, prompt: list[int], wait_s: float):
    """The router's order: the Prefill job first, the decode's Reserve, then the grant;
    up to `wait_s` for the job's first token before the grant goes. (The sender's calls
    and the token sampled by then, tokens, outcome.)"""
    calls = _recording(c.sender)
    grant = asyncio.get_running_loop().create_future()
    run = asyncio.ensure_future(c.prefill.prefill(
        request_id=request_id, tenant="t", generation=1, transfer_id=f"{request_id}/1", prompt=prompt,
        sampling=GREEDY, abi_digest=c.d.loop.engine.abi.digest, target=grant))
    loop = asyncio.get_running_loop()
    give_up, task = loop.time() + wait_s, None
    while loop.time() < give_up and not (task is not None and task.seq is not None and task.seq.output_ids):
        await asyncio.sleep(0.01)
        task = c.prefill.tasks.get(f"{request_id}/1")
    seen = (list(calls), None if task is None or task.seq is None else list(task.seq.output_ids))
    res = await c.reserve(request_id, prompt, 4)
    stream = c.router_stream(res)
    grant.set_result(Target(c.receiver.address, res.first_block * c.d.loop.engine.block_size,
                            res.expected_layouts(), "d0", c.manifest(request_id, 1, prompt, res)))
    outcome = await run
    return seen, await stream, outcome


def test_a_job_computes_before_its_grant_and_sends_nothing_until_it_comes():
    """The router sends the Prefill job beside the decode's Reserve: a transfer too small
    to stream computes meanwhile (its first token is sampled before the grant), nothing
    reaches the data plane before the grant, and the hand-off equals colocated."""
    async def go():
        async with InprocCluster() as c:
            seen, tokens, outcome = await _job_then_grant(c, "j", PROMPT, 10.0)
            reference = await c.colocated("ref", PROMPT, 4)
            await c.assert_all_returned()
            return seen, tokens, reference, outcome

    (calls, sampled), tokens, reference, outcome = run(go())
    assert calls == [] and sampled == [tokens[0]]
    assert tokens == reference and outcome.first_token == tokens[0] and outcome.sent_chunks > 0


def test_a_job_that_may_stream_waits_for_its_grant_before_computing():
    """Streaming needs the chunk plan from the first layer: no compute before the grant."""
    async def go():
        async with InprocCluster(stream_min_bytes=0) as c:
            seen, tokens, outcome = await _job_then_grant(c, "js", PROMPT, 0.5)
            reference = await c.colocated("ref", PROMPT, 4)
            await c.assert_all_returned()
            return seen, tokens, reference

    (calls, sampled), tokens, reference = run(go())
    assert calls == [] and sampled is None
    assert tokens == reference


def test_the_reply_does_not_wait_for_the_blocks_to_be_freed():
    """The router holds token 0 for the Prefill's reply: the engine thread frees the
    prompt's blocks after it (~1 ms here), and the task owns them until it has."""
    async def go():
        async with InprocCluster() as c:
            gate, release = asyncio.Event(), c.prefill._release

            async def held(task, transfer_id):
                await gate.wait()
                await release(task, transfer_id)
            c.prefill._release = held
            res = await c.reserve("f", PROMPT, 3)
            stream = c.router_stream(res)
            outcome = await asyncio.wait_for(c.send("f", res, PROMPT), 10)
            owned, held_blocks = list(c.prefill.tasks), c.prefill.held_blocks()
            gate.set()
            tokens = await stream
            await c.assert_all_returned()
            return outcome, owned, held_blocks, tokens

    outcome, owned, held_blocks, tokens = run(go())
    assert outcome.first_token == tokens[0] and len(tokens) == 3
    assert owned == ["f/1"] and held_blocks > 0  # returned, not yet freed: still owned


@pytest.mark.parametrize("limit,on_loop", [(1 << 30, True), (0, False)])
def test_a_small_transfers_digest_is_taken_on_the_event_loop_and_a_large_ones_on_the_engine_thread(
        monkeypatch, limit, on_loop):
    """The decode's digest of what it received: inline on the event loop when the engine is
    idle and the K/V is small (no thread hand-off on the critical path), on the engine's
    thread past INLINE_DIGEST_BYTES; the same digest either way (the hand-off publishes)."""
    import threading

    import decode_worker.worker as decode_module
    monkeypatch.setattr(decode_module, "INLINE_DIGEST_BYTES", limit)

    async def go():
        async with InprocCluster() as c:
            threads = []
            engine = c.d.loop.engine
            digest = engine.kv_digest

            def recorded(seq, num_tokens=None):
                threads.append(threading.get_ident())
                return digest(seq, num_tokens)
            monkeypatch.setattr(engine, "kv_digest", recorded)
            tokens, _ = await c.handoff("r", PROMPT, 3)
            reference = await c.colocated("ref", PROMPT, 3)
            await c.assert_all_returned()
            return tokens, reference, threads, threading.get_ident()

    tokens, reference, threads, loop_thread = run(go())
    assert tokens == reference
    assert len(threads) == 1 and (threads[0] == loop_thread) is on_loop
