"""Router orchestration over an in-process fake cluster (tests/support/orchestrator.py):
cancellation (by the router, by a client gone before token zero, during admission)
and deadlines (the request's, the first token's), each reaching every worker the
request touched. Every lifecycle test ends with a leak check."""

from __future__ import annotations

import asyncio

import pytest

from router.requests.orchestrator import Orchestrator
from router.types import (
    Completed,
    FinishReason,
    Mode,
    RouterError,
    Started,
    StatusCode,
    WorkerCallError,
)
from tests.support.orchestrator import (
    assert_no_leaks,
    collect,
    config,
    params,
    run,
    two_by_two,
)


def test_router_cancel_mid_stream_reaches_prefill_and_decode():
    fake = two_by_two()

    async def go():
        orch = Orchestrator(fake, fake, config())
        fake.token_gap_s = 0.05
        run_ = await orch.submit(params(max_tokens=50))
        seen = []
        async for ev in run_.stream():
            seen.append(ev)
            if len(seen) == 3:  # Started, token 0, token 1
                assert await orch.cancel("r", "user hit stop")
        assert not await orch.cancel("r")  # gone: unknown id
        await orch.drain()
        return orch, seen

    orch, events = run(go())
    done = events[-1]
    assert isinstance(done, Completed) and done.finish_reason is FinishReason.CANCELLED
    assert 2 <= done.num_tokens < 50
    assert ("cancel_decode", "d1", "r", 1) in fake.calls and ("cancel_prefill", "p0", "r", 1) in fake.calls
    assert_no_leaks(orch, fake)


@pytest.mark.parametrize("mode", [Mode.COLOCATED, Mode.DISAGGREGATED])
def test_a_cancel_that_arrives_with_a_token_is_not_lost(mode):
    """The client leaves in the same event-loop step as a token reaches the router's queue:
    the request still stops. (asyncio.wait_for on Python 3.11 returned that token and dropped
    the cancel; the request then decoded all its tokens with nobody reading.)"""
    fake = two_by_two()

    async def go():
        orch = Orchestrator(fake, fake, config())
        fake.token_gap_s = 0.01
        run_ = await orch.submit(params(max_tokens=200, mode=mode))
        fake.after_token = lambda i: i == 2 and run_.cancel("client went away")
        events = [ev async for ev in run_.stream()]
        await orch.drain()
        return orch, events

    orch, events = run(go())
    done = events[-1]
    assert isinstance(done, Completed) and done.finish_reason is FinishReason.CANCELLED, done
    assert done.num_tokens <= 4 and done.route.name == mode.name
    assert any(c[0] == "cancel_decode" for c in fake.calls)
    assert_no_leaks(orch, fake)


def test_client_disconnect_before_token_zero_aborts_and_cancels_everywhere():
    fake = two_by_two()
    fake.hang.add(("decode_stream", "d1"))
    fake.hang.add(("prefill", "p0"))

    async def go():
        orch = Orchestrator(fake, fake, config())
        gen = orch.generate(params())
        assert isinstance(await gen.__anext__(), Started)
        await asyncio.sleep(0.01)
        await gen.aclose()  # what a cancelled servicer does
        await orch.drain()
        return orch

    orch = run(go())
    assert [c[0] for c in fake.calls[-3:]] == ["txn_abort", "cancel_decode", "cancel_prefill"]
    assert_no_leaks(orch, fake)


def test_request_deadline_cancels_everything():
    fake = two_by_two()
    fake.hang.add(("decode_stream", "d1"))

    async def go():
        orch = Orchestrator(fake, fake, config())
        return orch, *(await collect(orch, params(deadline_ms=100)))

    orch, events, error = run(go())
    assert error.code is StatusCode.DEADLINE_EXCEEDED
    assert "100 ms" in error.message and "attempt 1 (disaggregated p0 -> d1)" in error.message
    assert ("txn_abort", "r/1") in [c[:2] for c in fake.calls]
    assert ("cancel_decode", "d1", "r", 1) in fake.calls and ("cancel_prefill", "p0", "r", 1) in fake.calls
    assert_no_leaks(orch, fake)


def test_first_token_timeout_counts_as_a_failed_attempt():
    fake = two_by_two()
    fake.hang.add(("decode_stream", "d1"))

    async def go():
        orch = Orchestrator(fake, fake, config(first_token_timeout_s=0.05))
        return orch, *(await collect(orch, params()))

    orch, events, error = run(go())
    assert error is None and events[-1].attempts == 2
    assert ("txn_abort", "r/1") in [c[:2] for c in fake.calls]
    assert_no_leaks(orch, fake)


def test_a_cancel_during_admission_ends_the_request_cancelled():
    """Found by the cancel storm: Router.Cancel of a request still in admission (its
    snapshot fetch in flight, no task yet) failed UNKNOWN with an AttributeError."""
    fake = two_by_two()

    async def go():
        orch = Orchestrator(fake, fake, config())
        gate = asyncio.Event()
        real_snapshot = fake.snapshot

        async def slow_snapshot(timeout_s):
            await gate.wait()
            return await real_snapshot(timeout_s)

        fake.snapshot = slow_snapshot
        submitted = asyncio.ensure_future(orch.submit(params()))
        await asyncio.sleep(0.01)
        found = await orch.cancel("r", "changed my mind")
        gate.set()
        with pytest.raises(RouterError) as err:
            await submitted
        return orch, found, err.value

    orch, found, error = run(go())
    assert found is True
    assert error.code is StatusCode.CANCELLED and "changed my mind" in error.message
    assert fake.ops("reserve") == []
    assert_no_leaks(orch, fake)


def test_attempts_failing_on_the_requests_own_deadline_end_deadline_exceeded_without_more_attempts():
    """Found in CI: the calls of an attempt carry the request's deadline, so they can
    fail DEADLINE_EXCEEDED just before the router's own timer fires; the router then
    ran two more (instantly failing) attempts and answered UNAVAILABLE."""
    fake = two_by_two()
    now = [0.0]
    reserve = fake.reserve

    async def late_reserve(w, call, timeout_s):
        await reserve(w, call, timeout_s)
        now[0] = 5.0  # the call took the request's whole deadline
        raise WorkerCallError(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    fake.reserve = late_reserve

    async def go():
        orch = Orchestrator(fake, fake, config(), clock=lambda: now[0])
        return orch, *(await collect(orch, params(deadline_ms=1000)))

    orch, events, error = run(go())
    assert error is not None and error.code is StatusCode.DEADLINE_EXCEEDED
    assert "request deadline of 1000 ms passed" in error.message
    assert len(fake.ops("reserve")) == 1
    assert_no_leaks(orch, fake)


def test_a_cancel_while_the_directory_reserves_aborts_after_its_answer():
    """The attempt streams before the directory answered its Reserve (the prefill's token 0
    needs no record): a cancel then waits for that answer before the Abort, which must
    not overtake a Reserve the directory applies after it (a record left RESERVED). The
    DecodeStream, which leaves once the directory answered, never left."""
    fake = two_by_two()
    reserving = fake.reserve_txn

    async def slow_reserve(manifest, timeout_s):
        fake.calls.append(("txn_reserve_sent", manifest.transfer_id))
        await asyncio.sleep(0.1)  # the cancel comes meanwhile
        answer = await reserving(manifest, timeout_s)
        fake.calls.append(("txn_reserve_answered", manifest.transfer_id))
        return answer
    fake.reserve_txn = slow_reserve
    fake.hang.add(("decode_stream", "d1"))

    async def go():
        orch = Orchestrator(fake, fake, config())
        run_ = await orch.submit(params(request_id="r", mode=Mode.DISAGGREGATED))
        while not any(c[0] == "txn_reserve_sent" for c in fake.calls):
            await asyncio.sleep(0.005)
        assert await orch.cancel("r", "changed my mind")
        async for _ in run_.stream():
            pass
        await orch.drain()
        return orch

    orch = run(go())
    ops = [c[0] for c in fake.calls]
    assert ops.index("txn_reserve_answered") < ops.index("txn_abort")
    assert fake.ops("prefill") and not fake.ops("decode_stream")  # granted; the stream waits for the record
    assert fake.txns["r/1"] == "ABORTED"
    assert_no_leaks(orch, fake)
