"""A prefill job that finds the block pool full waits for room instead of failing
(prefill_worker/room.py).

A fresh-clone CI run once had 1 of 200 burst requests fail its first attempt with the
*prefill's* "OutOfBlocks: need 1 K/V blocks, 0 free of 512": the router admits by the
decode's room, and the prefill's pool was full for a moment of prefills about to free
theirs. Here the real PrefillWorker and DecodeWorker on tiny engines (the prefill's
pool smaller than the decode's) show the job waiting, first come first served, and
served once the prefill ahead of it gives its blocks back.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from prefill_worker.role import PrefillRole
from prefill_worker.room import PoolQueue
from runtime.engine import OutOfBlocks
from runtime.worker.node import pending_prefill_tokens
from tests.support.inproc_cluster import InprocCluster

rng = random.Random(21)
LARGE = [rng.randrange(3, 500) for _ in range(150)]  # 10 blocks of 16 at the prefill
MIDDLE = [rng.randrange(3, 500) for _ in range(100)]  # 7
SMALL = [rng.randrange(3, 500) for _ in range(20)]  # 2
POOL = 16  # the prefill's blocks: LARGE and MIDDLE do not fit together, LARGE and SMALL do


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def until(cond, what: str, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def hold_commit(c: InprocCluster, request_id: str) -> asyncio.Event:
    """The COMMIT of `request_id`'s transfer waits for the returned event: its prefill
    holds its blocks until then (as one awaiting a slow destination's verdict)."""
    gate, real = asyncio.Event(), c.sender.commit

    async def commit(dest, commit):
        if commit.request_id == request_id:
            await gate.wait()
        return await real(dest, commit)
    c.sender.commit = commit
    return gate


def test_a_job_that_finds_the_pool_full_waits_and_is_served():
    async def go():
        async with InprocCluster(prefill_blocks=POOL) as c:
            gate = hold_commit(c, "a")
            res_a, res_b = await c.reserve("a", LARGE, 3), await c.reserve("b", MIDDLE, 3)
            streams = [c.router_stream(r) for r in (res_a, res_b)]
            run_a = asyncio.ensure_future(c.send("a", res_a, LARGE))
            await until(lambda: c.prefill.held_blocks() == 10, "the first prefill's blocks")
            run_b = asyncio.ensure_future(c.send("b", res_b, MIDDLE))
            await until(lambda: len(c.prefill.room) == 1, "the second job to wait")
            role = PrefillRole()
            role.worker = c.prefill
            seen = dict(waiting=c.prefill.room.waiting_tokens, b_done=run_b.done(),
                        reported=pending_prefill_tokens(c.p.loop, [role]))
            gate.set()
            outcomes = await asyncio.gather(run_a, run_b)
            tokens = [await s for s in streams]
            refs = [await c.colocated("ra", LARGE, 3), await c.colocated("rb", MIDDLE, 3)]
            await c.assert_all_returned()
            waits = c.prefill.metrics.registry.get_sample_value("pd_prefill_pool_waits_total")
            return seen, tokens, refs, outcomes, len(c.prefill.room), waits

    seen, tokens, refs, outcomes, left, waits = run(go())
    assert seen == dict(waiting=len(MIDDLE), b_done=False, reported=len(MIDDLE))
    assert tokens == refs and [o.first_token for o in outcomes] == [t[0] for t in tokens]
    assert (left, waits) == (0, 1)


def test_a_small_job_does_not_overtake_a_waiting_one_and_a_cancel_passes_the_turn():
    async def go():
        async with InprocCluster(prefill_blocks=POOL) as c:
            gate = hold_commit(c, "a")
            res = {rid: await c.reserve(rid, p, 2) for rid, p in (("a", LARGE), ("b", MIDDLE), ("c", SMALL))}
            run_a = asyncio.ensure_future(c.send("a", res["a"], LARGE))
            await until(lambda: c.prefill.held_blocks() == 10, "the first prefill's blocks")
            run_b = asyncio.ensure_future(c.send("b", res["b"], MIDDLE))
            await until(lambda: len(c.prefill.room) == 1, "the middle job to wait")
            run_c = asyncio.ensure_future(c.send("c", res["c"], SMALL))  # would fit: waits behind b
            stream_c = asyncio.ensure_future(c.collect(c.decode.stream(res["c"].transfer_id)))
            await until(lambda: len(c.prefill.room) == 2, "the small job to queue behind")
            queued = (run_b.done(), run_c.done(), c.prefill.held_blocks())
            await c.prefill.cancel("b")
            with pytest.raises(asyncio.CancelledError):
                await run_b
            out_c = await run_c  # its turn: it fits beside a
            stream_a = asyncio.ensure_future(c.collect(c.decode.stream(res["a"].transfer_id)))
            gate.set()
            await run_a
            tokens = [await stream_a, await stream_c]
            refs = [await c.colocated("ra", LARGE, 2), await c.colocated("rc", SMALL, 2)]
            await c.assert_all_returned()  # b's reservation and transaction aborted, nothing held
            return queued, out_c, tokens, refs

    queued, out_c, tokens, refs = run(go())
    assert queued == (False, False, 10)
    assert tokens == refs and out_c.first_token == tokens[1][0]


def test_a_job_larger_than_the_whole_pool_fails_at_once():
    async def go():
        async with InprocCluster(prefill_blocks=POOL) as c:
            prompt = [rng.randrange(3, 500) for _ in range(POOL * 16 + 1)]
            res = await c.reserve("x", prompt, 2)
            with pytest.raises(OutOfBlocks) as err:
                await asyncio.wait_for(c.send("x", res, prompt), 5)
            await c.assert_all_returned()
            return err.value, len(c.prefill.room)

    err, left = run(go())
    assert (err.needed_blocks, err.total_blocks, left) == (POOL + 1, POOL, 0)


class FakePool:
    """A pool of 8 blocks with `free` of them free; `attempt` takes `need` (never holds any)."""

    def __init__(self, need: int):
        self.need, self.free = need, 0

    async def attempt(self) -> str:
        if self.free < self.need:
            raise OutOfBlocks(self.need, self.free, 8)
        return "allocated"


def test_blocks_freed_elsewhere_are_found_by_the_poll():
    """A mixed worker's decodes free blocks without a prefill's release: the head retries."""
    async def go():
        room, pool = PoolQueue(poll_s=0.01), FakePool(3)
        job = asyncio.ensure_future(room.allocate(pool.attempt, 40))
        await until(lambda: len(room) == 1, "the job to wait")
        await asyncio.sleep(0.05)
        waiting = (job.done(), room.waiting_tokens)
        pool.free = 3  # no freed() call
        return waiting, await asyncio.wait_for(job, 2), len(room), room.waiting_tokens

    assert run(go()) == ((False, 40), "allocated", 0, 0)


def test_a_waiter_cancelled_as_its_turn_comes_passes_it_on():
    """The head leaves while the next waiter's cancel is pending: the turn goes on to the
    third, not lost, and nothing raises."""
    async def go():
        room, pool = PoolQueue(poll_s=0.01), FakePool(1)
        jobs = [asyncio.ensure_future(room.allocate(pool.attempt, n)) for n in (10, 20, 30)]
        await until(lambda: len(room) == 3, "three waiters")
        pool.free = 1
        room.freed()  # the head wakes first...
        jobs[1].cancel()  # ...the next one's turn future is cancelled now, its finally runs after the head's
        got = await asyncio.wait_for(jobs[0], 2), await asyncio.wait_for(jobs[2], 2)
        with pytest.raises(asyncio.CancelledError):
            await jobs[1]
        return got, len(room), room.waiting_tokens

    assert run(go()) == (("allocated", "allocated"), 0, 0)
