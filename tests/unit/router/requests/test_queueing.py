"""The admission queue (router/requests/queueing.py; docs/architecture.md, Router retries
and the admission queue): a burst waits for K/V room instead of being shed, tenants are
served round robin, each tenant's queue is bounded, and a waiter leaves only when its
deadline can no longer be met. Over the in-process fake cluster of
tests/support/orchestrator.py, whose decode worker reports a fixed number of free blocks:
this router's own in-flight requests are what fills it (the overlay), so room frees exactly
when requests end."""

from __future__ import annotations

import asyncio

from router.requests.orchestrator import Orchestrator
from router.types import Mode, RouterError, StatusCode
from runtime.directory.records import WorkerRole
from tests.support.orchestrator import (
    PROMPT,
    FakeCluster,
    assert_no_leaks,
    collect,
    config,
    model_tokens,
    params,
    run,
    tokens_of,
    worker,
)

NEED = 4  # blocks per request: 9 prompt + 6 tokens - 1 = 14 tokens of 4 per block


class Gauged(FakeCluster):
    """Counts requests holding blocks at the decode worker (reserve/generate to stream end)."""

    def __init__(self, free_blocks: int):
        super().__init__([worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE, free=free_blocks)])
        self.token_gap_s = 0.01
        self.active = self.peak = 0
        self.order: list[str] = []

    def _hold(self, request_id: str) -> None:
        self.order.append(request_id)
        self.active += 1
        self.peak = max(self.peak, self.active)

    async def reserve(self, w, call, timeout_s):
        self._hold(call.request_id)
        return await super().reserve(w, call, timeout_s)

    async def decode_stream(self, w, call, timeout_s):
        try:
            async for item in super().decode_stream(w, call, timeout_s):
                yield item
        finally:
            self.active -= 1

    async def generate(self, w, call, timeout_s):
        self._hold(call.request_id)
        try:
            async for item in super().generate(w, call, timeout_s):
                yield item
        finally:
            self.active -= 1


def _burst(fake, requests, **cfg):
    async def go():
        orch = Orchestrator(fake, fake, config(**cfg))
        results = await asyncio.gather(*(collect(orch, p) for p in requests))
        return orch, results
    return run(go(), timeout_s=30)


def test_a_burst_larger_than_the_room_is_queued_and_every_request_served():
    fake = Gauged(free_blocks=2 * NEED)  # room for two at a time
    orch, results = _burst(fake, [params(request_id=f"r{i}", deadline_ms=20_000, mode=Mode.DISAGGREGATED)
                                  for i in range(12)])
    errors = [e for _, e in results if e is not None]
    assert not errors, errors
    for events, _ in results:
        assert tokens_of(events) == list(enumerate(model_tokens(PROMPT, 6)))
        assert events[-1].attempts == 1 and events[-1].failed_attempts == ""
    assert fake.peak == 2  # never more in flight than the room holds
    assert orch.queue.granted_total >= 10 and orch.queue.waiting == 0
    assert_no_leaks(orch, fake)


def test_tenants_are_served_round_robin():
    """Tenant a's burst of 8 arrives first; tenant b's 2 requests right after. With room
    for one at a time, b's requests are served second and fourth, not after all of a's."""
    fake = Gauged(free_blocks=NEED)
    burst = [params(request_id=f"a{i}", tenant="a", deadline_ms=20_000, mode=Mode.DISAGGREGATED) for i in range(8)]
    burst += [params(request_id=f"b{i}", tenant="b", deadline_ms=20_000, mode=Mode.DISAGGREGATED) for i in range(2)]
    orch, results = _burst(fake, burst)
    assert all(e is None for _, e in results), [e for _, e in results]
    b_turns = [i for i, rid in enumerate(fake.order) if rid.startswith("b")]
    assert b_turns and max(b_turns) <= 4, fake.order
    assert fake.order[0] == "a0" and fake.peak == 1
    assert_no_leaks(orch, fake)


def test_a_higher_priority_goes_ahead_of_its_tenants_waiters_only():
    """With room for one at a time, tenant a's urgent request (priority 5) arriving after
    four of a's waiting ones is a's next; tenant b's turn in the round robin is kept (a's
    turn came first: its first waiter queued before b's)."""
    fake = Gauged(free_blocks=NEED)

    async def go():
        orch = Orchestrator(fake, fake, config())
        runs = [asyncio.ensure_future(collect(orch, params(request_id=f"a{i}", tenant="a", deadline_ms=20_000,
                                                           mode=Mode.DISAGGREGATED))) for i in range(5)]
        await asyncio.sleep(0.02)
        runs.append(asyncio.ensure_future(collect(orch, params(request_id="b0", tenant="b", deadline_ms=20_000,
                                                               mode=Mode.DISAGGREGATED))))
        runs.append(asyncio.ensure_future(collect(orch, params(request_id="urgent", tenant="a", priority=5,
                                                               deadline_ms=20_000, mode=Mode.DISAGGREGATED))))
        return orch, await asyncio.gather(*runs)

    orch, results = run(go(), timeout_s=30)
    assert all(e is None for _, e in results), [e for _, e in results]
    assert fake.order[:4] == ["a0", "urgent", "b0", "a1"], fake.order
    assert_no_leaks(orch, fake)


def test_a_tenants_queue_is_bounded():
    fake = Gauged(free_blocks=NEED)
    orch, results = _burst(fake, [params(request_id=f"r{i}", deadline_ms=20_000, mode=Mode.DISAGGREGATED)
                                  for i in range(6)], queue_per_tenant=3)
    errors = [e for _, e in results if e is not None]
    # one runs, three wait, the other two find the queue full at once
    assert len(errors) == 2 and all(e.code is StatusCode.RESOURCE_EXHAUSTED for e in errors)
    assert all("admission queue of tenant 't' is full (3 requests" in e.message for e in errors), errors
    assert_no_leaks(orch, fake)


def test_a_request_whose_deadline_cannot_be_met_leaves_the_queue_early():
    """Patience = deadline left - predicted service time: the waiter behind a long
    request leaves RESOURCE_EXHAUSTED before its deadline (not DEADLINE_EXCEEDED at it),
    having waited as long as serving it in time stayed possible."""
    fake = Gauged(free_blocks=NEED)
    fake.token_gap_s = 0.5  # the first request holds the room for 3 s

    async def go():
        orch = Orchestrator(fake, fake, config(default_decode_step_ms=200.0))
        first = asyncio.ensure_future(collect(orch, params(request_id="long", deadline_ms=20_000,
                                                           mode=Mode.DISAGGREGATED)))
        await asyncio.sleep(0.05)
        t0 = asyncio.get_running_loop().time()
        error = None
        try:
            async for _ in orch.generate(params(request_id="late", deadline_ms=2_000, mode=Mode.DISAGGREGATED)):
                pass
        except RouterError as exc:
            error = exc
        waited = asyncio.get_running_loop().time() - t0
        await first
        return orch, error, waited

    orch, error, waited = run(go(), timeout_s=30)
    assert isinstance(error, RouterError) and error.code is StatusCode.RESOURCE_EXHAUSTED, error
    assert "no K/V room within the deadline" in error.message
    assert 0.3 < waited < 1.95, waited
    assert_no_leaks(orch, fake)
