"""A call that takes blocks gives them back when its caller stops waiting, whenever that
happens (runtime/worker/loop.py, safety invariant "ownership"; docs/design.md, Principles)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runtime.engine import Engine
from runtime.worker.loop import EngineLoop
from tests.support.engine import assert_no_leak, running_loop

PROMPT = list(range(3, 103))


@pytest.fixture
def loop():
    yield from running_loop(num_blocks=64)


async def _drained(loop: EngineLoop) -> None:
    """Run no-op calls until every queued call and every give-back has run."""
    for _ in range(100):
        await loop.call(lambda e: None)
        if loop.engine.num_free_blocks == loop.engine.blocks.num_blocks:
            return
        await asyncio.sleep(0.01)


def test_a_call_cancelled_while_queued_never_takes_blocks(loop):
    ran = []

    async def go():
        gate = threading.Event()
        busy = loop.call(lambda e: gate.wait(10))  # the loop thread is busy (a long prefill)
        alloc = asyncio.ensure_future(loop.call(
            lambda e: ran.append(1) or e.add_request("r", PROMPT, 8), undo=Engine.free))
        await asyncio.sleep(0.01)
        alloc.cancel()  # the caller's deadline passes while the call is queued
        gate.set()
        await busy
        with pytest.raises(asyncio.CancelledError):
            await alloc
        await _drained(loop)

    asyncio.run(go())
    assert ran == []
    assert_no_leak(loop.engine)


def test_a_call_cancelled_after_it_ran_gives_its_blocks_back(loop):
    async def go():
        allocated, proceed = threading.Event(), threading.Event()

        def alloc(e):
            seq = e.add_request("r", PROMPT, 8)
            allocated.set()
            proceed.wait(10)  # the caller gives up while the result is on its way
            return seq

        task = asyncio.ensure_future(loop.call(alloc, undo=Engine.free))
        assert await asyncio.to_thread(allocated.wait, 10)
        assert loop.engine.num_free_blocks < loop.engine.blocks.num_blocks
        task.cancel()
        proceed.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _drained(loop)

    asyncio.run(go())
    assert_no_leak(loop.engine)


def test_a_call_without_undo_runs_even_if_its_caller_left(loop):
    """Frees and other give-backs must run whether or not anyone waits for them."""
    async def go():
        seq = await loop.call(lambda e: e.add_request("r", PROMPT, 8), undo=Engine.free)
        gate = threading.Event()
        busy = loop.call(lambda e: gate.wait(10))
        free = asyncio.ensure_future(loop.call(lambda e: e.free(seq)))
        await asyncio.sleep(0.01)
        free.cancel()
        gate.set()
        await busy
        await _drained(loop)

    asyncio.run(go())
    assert_no_leak(loop.engine)


def test_a_cancel_between_delivery_and_resumption_gives_the_blocks_back(loop):
    """Found by the 1,000-request cancel storm: the result is delivered (the future
    done), then the awaiting task is cancelled before it runs again; asyncio throws
    CancelledError in at the await with the result in hand, which was dropped.

    Deterministic: the engine thread is held by a gate while two commands queue: the
    allocation, then one that schedules `task.cancel` on the event loop. The event
    loop itself is then held (a blocking wait, not an await) until the engine thread
    has run both, so its ready queue is [deliver allocation, cancel task] before it
    runs again: the delivery wakes the task, the cancel lands before the task resumes.
    (Awaiting instead let the event loop deliver and resume the task between the two
    commands on a fast machine: the CI failure this replaces.)"""
    async def go():
        aloop = asyncio.get_running_loop()
        gate = threading.Event()
        scheduled = threading.Event()

        def cancel_task(e):
            aloop.call_soon_threadsafe(task.cancel)
            scheduled.set()

        busy = loop.call(lambda e: gate.wait(10))
        task = asyncio.ensure_future(loop.call(lambda e: e.add_request("r", PROMPT, 8), undo=Engine.free))
        canceller = loop.call(cancel_task)
        await asyncio.sleep(0)  # the task starts awaiting
        gate.set()
        assert scheduled.wait(10)  # holds the event loop on purpose
        await busy
        await canceller
        with pytest.raises(asyncio.CancelledError):
            await task
        await _drained(loop)

    asyncio.run(go())
    assert_no_leak(loop.engine)


def test_a_call_after_stop_fails_at_once_instead_of_hanging(loop):
    """A task's cleanup (free its sequence) that runs after the worker stopped its loop:
    nothing will ever run the call, so it must fail, not leave the task waiting forever."""
    async def go():
        await loop.call(lambda e: None)
        loop.stop()
        with pytest.raises(RuntimeError, match="engine loop stopped"):
            await asyncio.wait_for(loop.call(lambda e: None), 5)

    asyncio.run(go())
