"""EngineLoop.call(..., inline=True): on an idle engine the call runs at once on the
caller's thread; while the engine works or a call is queued it queues, in order, and runs
on the loop thread (runtime/worker/loop.py, safety invariant)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runtime.engine import SamplingParams
from tests.support.engine import assert_no_leak, running_loop

PROMPT = list(range(3, 40))


@pytest.fixture
def loop():
    yield from running_loop(num_blocks=64)


def test_an_inline_call_on_an_idle_engine_runs_on_the_callers_thread(loop):
    async def go():
        await asyncio.sleep(0.05)  # the loop thread is waiting for work
        here = threading.get_ident()
        seq = await loop.add_request("r", PROMPT, 4, SamplingParams(), "tenant-a")
        ran_on = await loop.call(lambda e: threading.get_ident(), inline=True)
        await loop.call(lambda e: e.free(seq))
        return here, ran_on

    here, ran_on = asyncio.run(go())
    assert ran_on == here
    assert_no_leak(loop.engine)


def test_an_inline_call_queues_behind_a_busy_engine_and_keeps_order(loop):
    async def go():
        gate, order = threading.Event(), []
        busy = loop.call(lambda e: gate.wait(10) and order.append("busy"))  # a long step
        await asyncio.sleep(0.05)
        queued = loop.call(lambda e: order.append("queued"))
        inline = loop.call(lambda e: order.append("inline") or threading.get_ident(), inline=True)
        assert order == []  # nothing ran ahead of the busy engine or of the queued call
        gate.set()
        await asyncio.gather(busy, queued)
        return order, await inline

    order, ran_on = asyncio.run(go())
    assert order == ["busy", "queued", "inline"]
    assert ran_on == loop._thread.ident


def test_an_inline_call_that_fails_raises_at_the_await(loop):
    async def go():
        await asyncio.sleep(0.05)
        with pytest.raises(ValueError, match="no such prompt"):
            await loop.call(lambda e: (_ for _ in ()).throw(ValueError("no such prompt")), inline=True)
        return await loop.call(lambda e: "still serving", inline=True)

    assert asyncio.run(go()) == "still serving"


def test_an_inline_call_on_an_idle_engine_waits_behind_a_call_queued_before_it(loop):
    async def go():
        await asyncio.sleep(0.05)  # the loop thread waits on its wake-up event
        order, asleep = [], loop._wake
        loop._wake = threading.Event()  # so that the next call does not wake it (for <= 0.5 s)
        queued = loop.call(lambda e: order.append("queued"))
        inline = loop.call(lambda e: order.append("inline"), inline=True)
        ran_early = list(order)
        loop._wake.set()
        asleep.set()
        await asyncio.gather(queued, inline)
        return ran_early, order

    ran_early, order = asyncio.run(go())
    assert ran_early == [] and order == ["queued", "inline"]
