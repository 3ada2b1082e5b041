"""The two workers below the full cluster (issue 16): real PrefillWorker and
DecodeWorker on tiny engines, the inproc data plane, the real directory servicer
over the memory store (tests/inproc_cluster.py). A hand-off driven in the router's
order equals a colocated run, and every test ends with everything returned."""

from __future__ import annotations

import asyncio
import random

import pytest
from inproc_cluster import GREEDY, InprocCluster

from decode_worker.reservations import ResState
from prefill_worker.worker import TaskState, TransferRefused
from services.directory.states import TxnState

PROMPT = [random.Random(3).randrange(3, 500) for _ in range(70)]  # 5 blocks of 16


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_handoff_equals_colocated_and_gives_everything_back():
    async def go():
        async with InprocCluster() as c:
            tokens, outcome = await c.handoff("r", PROMPT, 6)
            reference = await c.colocated("ref", PROMPT, 6)
            record = await c.directory.lookup("r", "r/1")
            await c.assert_all_returned()
            return tokens, reference, outcome, record

    tokens, reference, outcome, record = run(go())
    assert tokens == reference and len(tokens) == 6
    assert outcome.first_token == tokens[0] and outcome.sent_chunks > 0
    assert record.state is TxnState.RELEASED  # decode released it when the sequence ended


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
            prefill = asyncio.ensure_future(c.prefill.prefill(
                request_id="x@computed", tenant="t", generation=1, transfer_id=res.transfer_id,
                first_token_pos=0, prompt=PROMPT, sampling=GREEDY, dest=c.receiver.address,
                abi_digest=c.d.loop.engine.abi.digest))
            while "x@computed/1" not in c.prefill.tasks or \
                    c.prefill.tasks["x@computed/1"].state is not TaskState.COMPUTING:
                await asyncio.sleep(0.01)
            task = c.prefill.tasks["x@computed/1"]
            assert await c.prefill.cancel("x@computed", 1)
            with pytest.raises(asyncio.CancelledError):
                await prefill
            assert task.state is TaskState.CANCELLED
            await c.decode.cancel("x@computed", 1)  # the router's teardown reaches D too
            record = await c.directory.lookup("x@computed", "x@computed/1")
            await c.assert_all_returned()
            return record, res

    record, res = run(go())
    assert record.state is TxnState.ABORTED
    assert res.state is ResState.ABORTED


def test_a_commit_whose_digest_does_not_match_the_bytes_is_refused_and_nothing_is_published():
    async def go():
        async with InprocCluster() as c:
            real = c.sender.commit

            async def lying_commit(dest, commit):
                return await real(dest, type(commit)(**{**{f: getattr(commit, f) for f in commit.__slots__},
                                                        "kv_digest": "0" * 32}))

            c.sender.commit = lying_commit
            res = await c.reserve("lie", PROMPT, 4)
            with pytest.raises(TransferRefused, match="K/V digest"):
                await c.prefill.prefill(request_id="lie", tenant="t", generation=1, transfer_id=res.transfer_id,
                                        first_token_pos=0, prompt=PROMPT, sampling=GREEDY,
                                        dest=c.receiver.address, abi_digest=c.d.loop.engine.abi.digest)
            record = await c.directory.lookup("lie", "lie/1")
            await c.assert_all_returned()
            return record, res

    record, res = run(go())
    assert record.state is TxnState.ABORTED and res.state is ResState.ABORTED


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
