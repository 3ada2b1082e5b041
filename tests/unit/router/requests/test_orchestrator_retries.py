"""Router orchestration over an in-process fake cluster (tests/support/orchestrator.py):
a failed attempt is torn down (its transaction aborted) and the next one runs on
another pair, or colocated; output already sent continues seamlessly; what is not
retried (a worker's INVALID_ARGUMENT) and what the next attempt avoids (a dead
worker). Every lifecycle test ends with a leak check."""

from __future__ import annotations

from router.requests.orchestrator import Orchestrator
from router.types import Route, StatusCode, WorkerCallError
from runtime.directory.records import WorkerRole
from runtime.directory.states import Outcome
from tests.support.orchestrator import (
    PROMPT,
    FakeCluster,
    assert_no_leaks,
    collect,
    config,
    model_tokens,
    params,
    run,
    started,
    tokens_of,
    two_by_two,
    unavailable,
    worker,
)


def test_prefill_failure_retries_on_another_pair_after_aborting_attempt_one():
    fake = two_by_two()
    fake.fail[("prefill", "p0")] = unavailable("p0 crashed")

    async def go():
        orch = Orchestrator(fake, fake, config())
        return orch, *(await collect(orch, params()))

    orch, events, error = run(go())
    assert error is None
    assert [(s.generation, s.prefill_worker_id, s.decode_worker_id) for s in started(events)] == \
        [(1, "p0", "d1"), (2, "p1", "d0")]
    assert tokens_of(events) == list(enumerate(model_tokens(PROMPT, 6)))
    assert events[-1].attempts == 2
    calls = fake.calls
    second_reserve = calls.index(("reserve", "d0", "r", 2))
    teardown = calls[calls.index(("txn_reserve", "r/1")) + 1:second_reserve]
    assert ("txn_abort", "r/1") in [c[:2] for c in teardown]
    assert ("cancel_decode", "d1", "r", 1) in teardown and ("cancel_prefill", "p0", "r", 1) in teardown
    assert [c[0] for c in teardown if c[0] not in ("prefill", "decode_stream")][:1] == ["txn_abort"]  # abort first
    assert fake.txns["r/1"] == "ABORTED" and fake.txns["r/2"] == "RELEASED"
    assert_no_leaks(orch, fake)


def test_two_disaggregated_failures_fall_back_to_colocated():
    fake = two_by_two()
    fake.fail[("prefill", "p0")] = fake.fail[("prefill", "p1")] = unavailable()

    async def go():
        orch = Orchestrator(fake, fake, config())
        return orch, *(await collect(orch, params()))

    orch, events, error = run(go())
    assert error is None
    assert [(s.route, s.generation) for s in started(events)] == \
        [(Route.DISAGGREGATED, 1), (Route.DISAGGREGATED, 2), (Route.COLOCATED, 3)]
    assert started(events)[-1].prefill_worker_id == ""
    assert (events[-1].route, events[-1].attempts) == (Route.COLOCATED, 3)
    assert events[-1].prefill_kv_digest == events[-1].decode_kv_digest == ""
    # The Complete event says why the disaggregated attempts failed.
    assert events[-1].failed_attempts.startswith("attempt 1 (disaggregated p0 -> d1): prefill: UNAVAILABLE")
    assert "; attempt 2 (disaggregated p1 -> d0): prefill: UNAVAILABLE" in events[-1].failed_attempts
    assert fake.ops("generate") == [("generate", "d1", "r", 3)]
    assert_no_leaks(orch, fake)


def test_every_attempt_failing_is_unavailable_listing_each_attempt():
    fake = two_by_two()
    fake.fail[("prefill", "p0")] = unavailable("p0 crashed")
    fake.fail[("reserve", "d0")] = WorkerCallError(StatusCode.FAILED_PRECONDITION, "cache ABI mismatch")
    fake.fail[("generate", "d1")] = fake.fail[("generate", "d0")] = unavailable("no engine")

    async def go():
        orch = Orchestrator(fake, fake, config())
        return orch, *(await collect(orch, params()))

    orch, events, error = run(go())
    assert error.code is StatusCode.UNAVAILABLE
    msg = error.message
    assert msg.startswith("all 3 attempts failed")
    assert "attempt 1 (disaggregated p0 -> d1): prefill: UNAVAILABLE: p0 crashed" in msg
    assert "attempt 2 (disaggregated p1 -> d0): decode reserve: FAILED_PRECONDITION: cache ABI mismatch" in msg
    assert "attempt 3 (colocated on d1): colocated generate: UNAVAILABLE: no engine" in msg
    assert [c[1:] for c in fake.ops("reserve")] == [("d1", "r", 1), ("d0", "r", 2)]
    assert_no_leaks(orch, fake)


def test_failure_after_partial_output_continues_seamlessly():
    fake = two_by_two()
    fake.break_after["d1"] = 3

    async def go():
        orch = Orchestrator(fake, fake, config())
        return orch, *(await collect(orch, params(max_tokens=8)))

    orch, events, error = run(go())
    assert error is None
    assert tokens_of(events) == list(enumerate(model_tokens(PROMPT, 8)))  # each index exactly once
    assert [s.generation for s in started(events)] == [1, 2]
    assert (events[-1].num_tokens, events[-1].attempts) == (8, 2)
    assert ("cancel_decode", "d1", "r", 1) in fake.calls
    assert ("txn_abort", "r/1") not in [c[:2] for c in fake.calls]  # published: D releases it
    # Attempt 2 resumed: the prompt and all but the last of the 3 tokens given, from step 2 on.
    assert fake.reserved_prompts["r/2"] == PROMPT + tuple(model_tokens(PROMPT, 2))
    assert fake.prefill_sampling.first_step == 2
    assert_no_leaks(orch, fake)


def test_without_resuming_the_next_attempt_regenerates_every_token_given():
    fake = two_by_two()
    fake.break_after["d1"] = 3

    async def go():
        orch = Orchestrator(fake, fake, config(resume_mid_stream=False))
        return orch, *(await collect(orch, params(max_tokens=8)))

    orch, events, error = run(go())
    assert error is None and tokens_of(events) == list(enumerate(model_tokens(PROMPT, 8)))
    assert fake.reserved_prompts["r/2"] == PROMPT and fake.prefill_sampling.first_step == 0
    assert_no_leaks(orch, fake)


def test_divergent_retry_is_an_internal_error_naming_the_index():
    fake = two_by_two()
    fake.break_after["d1"] = 3
    fake.diverge["d0"] = 0  # the resumed attempt's token 0: the last token given, computed again

    async def go():
        orch = Orchestrator(fake, fake, config())
        return orch, *(await collect(orch, params(max_tokens=8)))

    orch, events, error = run(go())
    assert error.code is StatusCode.INTERNAL and "divergence at index 2" in error.message
    assert len(tokens_of(events)) == 3
    assert ("cancel_decode", "d0", "r", 2) in fake.calls and ("cancel_prefill", "p0", "r", 2) in fake.calls
    assert_no_leaks(orch, fake)


def test_invalid_argument_from_a_worker_is_returned_verbatim_without_retry():
    fake = two_by_two()
    fake.fail[("reserve", "d1")] = WorkerCallError(StatusCode.INVALID_ARGUMENT, "top_k must be <= vocab")

    async def go():
        orch = Orchestrator(fake, fake, config())
        return orch, *(await collect(orch, params()))

    orch, events, error = run(go())
    assert error.code is StatusCode.INVALID_ARGUMENT and "top_k must be <= vocab" in error.message
    assert len(fake.ops("reserve")) == 1 and ("cancel_decode", "d1", "r", 1) in fake.calls
    assert_no_leaks(orch, fake)


def test_directory_refusal_cancels_the_reservation_and_moves_on():
    fake = two_by_two()
    fake.txn_outcome = Outcome.STALE_GENERATION

    async def go():
        orch = Orchestrator(fake, fake, config())
        return orch, *(await collect(orch, params()))

    orch, events, error = run(go())
    assert error is None and events[-1].route is Route.COLOCATED and events[-1].attempts == 3
    assert ("cancel_decode", "d1", "r", 1) in fake.calls and ("cancel_decode", "d0", "r", 2) in fake.calls
    assert not fake.ops("txn_abort")  # a refused reservation opened nothing
    # P was asked beside the directory's Reserve (it computes meanwhile): each such call is cancelled.
    for _, p, rid, g in fake.ops("prefill"):
        assert ("cancel_prefill", p, rid, g) in fake.calls
    assert_no_leaks(orch, fake)


def test_a_dead_worker_is_avoided_by_the_fallback_and_by_the_next_request():
    fake = FakeCluster([worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE),
                        worker("d1", WorkerRole.DECODE, free=60)])
    dead = unavailable("failed to connect to all addresses")
    fake.fail[("reserve", "d0")] = fake.fail[("generate", "d0")] = dead
    fake.fail[("prefill", "p0")] = unavailable("transfer failed")

    async def go():
        orch = Orchestrator(fake, fake, config())
        first = await collect(orch, params("a"))
        del fake.fail[("prefill", "p0")]
        second = await collect(orch, params("b"))
        return orch, first, second

    orch, (events_a, error_a), (events_b, error_b) = run(go())
    assert error_a is None and error_b is None
    # a: d0 refused the reserve (certainly its fault), then p0 -> d1 failed in the
    # hand-off (either end's); the colocated fallback must not go back to d0.
    assert [(s.route, s.decode_worker_id) for s in started(events_a)] == \
        [(Route.DISAGGREGATED, "d1"), (Route.COLOCATED, "d1")]
    assert [c[1:3] for c in fake.ops("reserve")][:2] == [("d0", "a"), ("d1", "a")]
    # b: d0 failed moments ago, so the next request does not try it at all.
    assert [c[1] for c in fake.ops("reserve") if c[2] == "b"] == ["d1"]
    assert events_b[-1].attempts == 1
    assert_no_leaks(orch, fake)


def test_a_colocated_worker_that_answers_beats_a_pair_with_one_that_did_not():
    fake = FakeCluster([worker("p0", WorkerRole.PREFILL), worker("d1", WorkerRole.DECODE),
                        worker("m0", WorkerRole.MIXED)])
    fake.fail[("reserve", "d1")] = unavailable("Connection refused")
    fake.fail[("reserve", "m0")] = WorkerCallError(StatusCode.FAILED_PRECONDITION, "no room for a hand-off")

    async def go():
        orch = Orchestrator(fake, fake, config(unreachable_wait_ms=5_000, max_disaggregated_attempts=3,
                                               max_attempts=4))
        return orch, *(await collect(orch, params()))

    orch, events, error = run(go())
    assert error is None
    assert [(s.route, s.decode_worker_id) for s in started(events)] == [(Route.COLOCATED, "m0")]
    assert [c[1] for c in fake.ops("reserve")] == ["d1", "m0"]  # not d1 again, and no wait
    assert_no_leaks(orch, fake)
