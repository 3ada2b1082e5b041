"""StoreCalls: which store makes a hand-off call, and on which thread (kv_directory/store_calls.py).

The stores here are stand-ins that say who they are; the clock is a fake one that a
call moves forward by the time it "took"."""

from __future__ import annotations

import asyncio
import threading

import pytest

from kv_directory.store_calls import StoreCalls
from runtime.directory.records import DirectoryUnavailable

BUDGET_S, COOL_OFF_S = 0.01, 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Store:
    """A store that answers (its name, whether it ran on the event loop's thread)."""

    def __init__(self, name: str, clock: Clock, twin: Store | None = None) -> None:
        self.name, self.clock, self.twin = name, clock, twin
        self.took_s = 0.0
        self.fail = False
        self.asked_budget: float | None = None
        self.closed = False

    def inline_twin(self, budget_s: float) -> Store | None:
        self.asked_budget = budget_s
        return self.twin

    def close(self) -> None:
        self.closed = True


def call(store: Store, loop_thread: int) -> tuple[str, bool]:
    store.clock.now += store.took_s
    if store.fail:
        raise DirectoryUnavailable(f"{store.name} gave up")
    return store.name, threading.get_ident() == loop_thread


def make(budget_s: float = BUDGET_S, twin: bool = True):
    clock = Clock()
    outcomes: list[str] = []
    store = Store("store", clock, Store("twin", clock) if twin else None)
    return StoreCalls(store, 2, budget_s=budget_s, cool_off_s=COOL_OFF_S, on_inline=outcomes.append,
                      clock=clock), store, clock, outcomes


def run(calls: StoreCalls, n: int = 1) -> list[tuple[str, bool]]:
    async def go():
        me = threading.get_ident()
        return [await calls.handoff(call, me) for _ in range(n)]
    return asyncio.run(go())


def test_the_first_call_probes_the_twin_on_the_pool_and_the_next_ones_run_inline():
    calls, store, _, outcomes = make()
    assert run(calls, 3) == [("twin", False), ("twin", True), ("twin", True)]
    assert store.asked_budget == BUDGET_S
    assert outcomes == ["answered"] * 3
    calls.close()
    assert store.twin.closed


def test_without_a_twin_or_a_budget_every_call_is_pooled_on_the_full_store():
    calls, store, _, outcomes = make(twin=False)
    assert run(calls, 2) == [("store", False)] * 2
    calls, store, _, outcomes = make(budget_s=0)
    assert run(calls, 2) == [("store", False)] * 2
    assert store.asked_budget is None and outcomes == []


def test_a_twin_that_gives_up_has_its_call_made_again_on_the_pool_then_cools_off():
    calls, store, clock, outcomes = make()
    assert run(calls, 1) == [("twin", False)]  # proven
    store.twin.fail = True
    assert run(calls, 1) == [("store", False)]  # tried inline, gave up, made again on the pool
    assert outcomes == ["answered", "unavailable"]
    store.twin.fail = False
    assert run(calls, 2) == [("store", False)] * 2  # cooling off: the twin is not asked
    clock.now += COOL_OFF_S
    assert run(calls, 2) == [("twin", False), ("twin", True)]  # a probe again, then inline
    assert outcomes == ["answered", "unavailable", "answered", "answered"]


def test_a_slow_answer_is_kept_and_the_pool_takes_the_calls_for_the_cool_off():
    calls, store, clock, outcomes = make()
    run(calls, 2)
    store.twin.took_s = BUDGET_S * 3
    assert run(calls, 1) == [("twin", True)]  # kept
    store.twin.took_s = 0
    assert run(calls, 1) == [("store", False)]
    assert outcomes == ["answered", "answered", "slow"]
    clock.now += COOL_OFF_S
    assert run(calls, 1) == [("twin", False)]


def test_a_probe_that_gives_up_is_made_again_on_the_pool():
    calls, store, _, outcomes = make()
    store.twin.fail = True
    assert run(calls, 2) == [("store", False), ("store", False)]
    assert outcomes == ["unavailable"]


def test_while_another_call_is_on_the_pool_or_probing_the_call_is_pooled():
    calls, store, _, _ = make()
    run(calls, 1)  # proven
    release = threading.Event()

    async def go():
        me = threading.get_ident()
        blocking = asyncio.ensure_future(calls.pooled(release.wait, 5))
        await asyncio.sleep(0.05)
        during = await calls.handoff(call, me)
        release.set()
        await blocking
        return during, await calls.handoff(call, me)
    assert asyncio.run(go()) == (("store", False), ("twin", True))

    calls, store, _, _ = make()
    store.twin.took_s = 0

    async def probing():
        me = threading.get_ident()
        gate = threading.Event()

        def slow_probe(s, loop_thread):
            gate.wait(5)
            return call(s, loop_thread)
        first = asyncio.ensure_future(calls.handoff(slow_probe, me))
        await asyncio.sleep(0.05)
        second = await calls.handoff(call, me)  # the probe is out: pooled, the full store
        gate.set()
        return await first, second
    assert asyncio.run(probing()) == (("twin", False), ("store", False))


def test_other_errors_pass_through_and_change_nothing():
    calls, store, _, outcomes = make()
    run(calls, 1)

    def refuse(_store):
        raise PermissionError("no")

    async def go():
        with pytest.raises(PermissionError):
            await calls.handoff(refuse)
        return await calls.handoff(call, threading.get_ident())
    assert asyncio.run(go()) == ("twin", True)
    assert outcomes == ["answered", "answered"]
