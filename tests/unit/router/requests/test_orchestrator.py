"""Router orchestration over an in-process fake cluster (tests/support/orchestrator.py):
routes, retries, continuation, cancellation, deadlines and admission. Every
lifecycle test ends with a leak check: nothing in flight, no overlay entries, no
open transaction."""

from __future__ import annotations

import asyncio
import hashlib
import struct

import pytest

from router.requests.orchestrator import Orchestrator
from router.types import (
    Capacity,
    Cluster,
    Completed,
    FinishReason,
    Mode,
    Role,
    Route,
    RouterError,
    Sampling,
    Slo,
    Started,
    StatusCode,
    TokenOut,
    TxnOutcome,
    Worker,
    WorkerCallError,
)
from tests.support.orchestrator import (
    PROMPT,
    VOCAB,
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


def test_happy_disaggregated_path():
    fake = two_by_two()

    async def go():
        orch = Orchestrator(fake, fake, config())
        events, error = await collect(orch, params())
        return orch, events, error

    orch, events, error = run(go())
    assert error is None
    assert started(events) == [Started(Route.DISAGGREGATED, "p0", "d1", 1, 7)]
    assert tokens_of(events) == list(enumerate(model_tokens(PROMPT, 6)))
    done = events[-1]
    assert isinstance(done, Completed) and (done.finish_reason, done.num_tokens, done.route, done.attempts) == \
        (FinishReason.LENGTH, 6, Route.DISAGGREGATED, 1)
    assert done.ttft_ms >= 0 and done.tpot_ms >= 0
    assert done.prefill_kv_digest == done.decode_kv_digest == "kv:r/1"
    assert [c[0] for c in fake.calls] == ["reserve", "txn_reserve", "prefill", "decode_stream"]
    m = fake.manifests[0]
    assert (m.request_id, m.tenant, m.generation, m.attempt, m.transfer_id, m.reservation_id) == \
        ("r", "t", 1, 1, "r/1", "r/1")
    assert m.prompt_digest == hashlib.sha256(struct.pack("<9I", *PROMPT)).hexdigest()
    assert (m.token_interval.start, m.token_interval.end, m.block_size) == (4, 9, 4)  # 1 visible prefix block of 4
    assert (m.source_worker_id, m.source_epoch, m.destination_worker_id, m.destination_epoch) == ("p0", 5, "d1", 5)
    assert (m.route_epoch, m.cache_abi_digest, m.checksum_algorithm) == (7, "abi-1", "xxh3_64")
    assert_no_leaks(orch, fake)


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
    teardown = calls[calls.index(("prefill", "p0", "r", 1)) + 1:second_reserve]
    assert ("txn_abort", "r/1") in [c[:2] for c in teardown]
    assert ("cancel_decode", "d1", "r", 1) in teardown and ("cancel_prefill", "p0", "r", 1) in teardown
    assert [c[0] for c in teardown if c[0] != "decode_stream"][:1] == ["txn_abort"]  # abort first
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
    assert_no_leaks(orch, fake)


def test_divergent_retry_is_an_internal_error_naming_the_index():
    fake = two_by_two()
    fake.break_after["d1"] = 3
    fake.diverge["d0"] = 1

    async def go():
        orch = Orchestrator(fake, fake, config())
        return orch, *(await collect(orch, params(max_tokens=8)))

    orch, events, error = run(go())
    assert error.code is StatusCode.INTERNAL and "divergence at index 1" in error.message
    assert len(tokens_of(events)) == 3
    assert ("cancel_decode", "d0", "r", 2) in fake.calls and ("cancel_prefill", "p0", "r", 2) in fake.calls
    assert_no_leaks(orch, fake)


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


@pytest.mark.parametrize("kw, code, needle", [
    (dict(prompt_token_ids=()), StatusCode.INVALID_ARGUMENT, "prompt is empty"),
    (dict(prompt_token_ids=None), StatusCode.INVALID_ARGUMENT, "no prompt"),
    (dict(max_tokens=0), StatusCode.INVALID_ARGUMENT, "max_tokens must be > 0"),
    (dict(max_tokens=5000), StatusCode.INVALID_ARGUMENT, "max_tokens 5000 exceeds this router's limit of 4096"),
    (dict(prompt_token_ids=(1, 2, 512)), StatusCode.INVALID_ARGUMENT,
     "prompt token id 512 at position 2 is out of range: vocab_size is 512"),
    (dict(max_tokens=250), StatusCode.INVALID_ARGUMENT,
     "prompt (9 tokens) + max_tokens (250) = 259 exceeds max_model_len 256"),
    (dict(prompt_token_ids=None, prompt_text="hello"), StatusCode.INVALID_ARGUMENT, "needs a tokenizer"),
    (dict(sampling=Sampling(temperature=-1.0)), StatusCode.INVALID_ARGUMENT, "temperature"),
    (dict(slo=Slo(ttft_ms=-1.0)), StatusCode.INVALID_ARGUMENT, "slo.ttft_ms must be a finite number >= 0"),
    (dict(mode=Mode.AUTO, slo=Slo(tpot_ms=float("nan"))), StatusCode.INVALID_ARGUMENT, "slo.tpot_ms"),
    # Limits in bytes, not characters (issue 15, item 8): 65 four-byte characters.
    (dict(request_id="\U0001F600" * 65), StatusCode.INVALID_ARGUMENT, "request_id is 260 bytes in UTF-8; at most 256"),
    (dict(request_id="r" * 257), StatusCode.INVALID_ARGUMENT, "request_id is 257 bytes"),
    (dict(tenant="t" * (1 << 20)), StatusCode.INVALID_ARGUMENT, "tenant is 1048576 bytes in UTF-8; at most 128"),
])
def test_validation_errors_name_the_problem_and_do_no_work(kw, code, needle):
    fake = two_by_two()
    p = params(**{"max_tokens": kw.pop("max_tokens", 6), **kw})

    async def go():
        orch = Orchestrator(fake, fake, config())
        with pytest.raises(RouterError) as err:
            await orch.submit(p)
        return orch, err.value

    orch, error = run(go())
    assert error.code is code and needle in error.message, error.message
    assert not [c for c in fake.calls if c[0] != "snapshot"]
    assert orch.in_flight == 0


def test_no_workers_is_unavailable_and_duplicates_are_rejected():
    empty = FakeCluster([])

    async def go():
        orch = Orchestrator(empty, empty, config())
        with pytest.raises(RouterError) as no_workers:
            await orch.submit(params())
        fake = two_by_two()
        fake.hang.add(("decode_stream", "d1"))
        orch = Orchestrator(fake, fake, config())
        first = await orch.submit(params())
        with pytest.raises(RouterError) as dup:
            await orch.submit(params())
        await orch.cancel("r")
        await orch.drain()
        return no_workers.value, dup.value, first

    no_workers, dup, first = run(go())
    assert no_workers.code is StatusCode.UNAVAILABLE and "no workers" in no_workers.message
    assert dup.code is StatusCode.ALREADY_EXISTS and "'r'" in dup.message
    assert first.finished


def test_request_too_big_for_any_worker_is_resource_exhausted_without_trying():
    fake = FakeCluster([worker("p0", Role.PREFILL), worker("d0", Role.DECODE)])
    fake.cluster = Cluster(tuple(w if w.can_prefill else Worker(
        w.worker_id, w.role, w.grpc_address, capacity=Capacity(total_blocks=3, block_size=4))
        for w in fake.cluster.workers))

    async def go():
        orch = Orchestrator(fake, fake, config())
        with pytest.raises(RouterError) as err:
            await orch.submit(params(max_tokens=10))
        return err.value

    error = run(go())
    assert error.code is StatusCode.RESOURCE_EXHAUSTED
    assert "needs 5 K/V blocks of 4 tokens" in error.message and "has only 3 blocks" in error.message
    assert fake.calls == []


def test_resource_exhausted_everywhere_tries_other_workers_then_waits_out_its_deadline():
    """Workers full although their heartbeats show room (issue 15, item 6): each refusal
    fences that worker full and the retry goes to another; with none left the request
    waits in the admission queue, and is refused once its deadline can no longer be met."""
    fake = two_by_two()
    full = WorkerCallError(StatusCode.RESOURCE_EXHAUSTED, "K/V blocks exhausted: 0 free")
    for w in ("d0", "d1"):
        fake.fail[("reserve", w)] = fake.fail[("generate", w)] = full

    async def go():
        orch = Orchestrator(fake, fake, config())
        t0 = asyncio.get_running_loop().time()
        out = await collect(orch, params(deadline_ms=1500))
        return orch, asyncio.get_running_loop().time() - t0, *out

    orch, took_s, events, error = run(go())
    assert error.code is StatusCode.RESOURCE_EXHAUSTED and "no K/V room within the deadline" in error.message
    assert [c[1] for c in fake.ops("reserve")] == ["d1", "d0"]  # never the same full worker twice
    assert "0 free" in error.message
    assert 1.0 < took_s < 1.5  # waited, and gave up before the deadline
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
    fake.txn_outcome = TxnOutcome.STALE_GENERATION

    async def go():
        orch = Orchestrator(fake, fake, config())
        return orch, *(await collect(orch, params()))

    orch, events, error = run(go())
    assert error is None and events[-1].route is Route.COLOCATED and events[-1].attempts == 3
    assert ("cancel_decode", "d1", "r", 1) in fake.calls and ("cancel_decode", "d0", "r", 2) in fake.calls
    assert not fake.ops("txn_abort", "prefill")
    assert_no_leaks(orch, fake)


def test_without_prefill_workers_disaggregated_requests_run_colocated():
    fake = FakeCluster([worker("d0", Role.DECODE), worker("d1", Role.DECODE, free=10)])

    async def go():
        orch = Orchestrator(fake, fake, config())
        return orch, *(await collect(orch, params(mode=Mode.DISAGGREGATED)))

    orch, events, error = run(go())
    assert error is None
    assert started(events) == [Started(Route.COLOCATED, "", "d0", 1, 7)]
    assert tokens_of(events) == list(enumerate(model_tokens(PROMPT, 6)))
    assert_no_leaks(orch, fake)


def test_colocated_mode_by_config_and_per_request():
    async def go(cfg_mode, mode):
        fake = two_by_two()
        orch = Orchestrator(fake, fake, config(default_mode=cfg_mode))
        events, _ = await collect(orch, params(mode=mode))
        return started(events)[0].route

    assert run(go("colocated", Mode.UNSPECIFIED)) is Route.COLOCATED
    assert run(go("colocated", Mode.DISAGGREGATED)) is Route.DISAGGREGATED
    assert run(go("disaggregated", Mode.COLOCATED)) is Route.COLOCATED


def test_sampled_requests_get_one_pinned_seed_for_every_attempt():
    fake = two_by_two()
    fake.fail[("prefill", "p0")] = unavailable()
    seen: list[Sampling] = []
    real_reserve = fake.reserve

    async def spy(w, call, timeout_s):
        seen.append(call.sampling)
        return await real_reserve(w, call, timeout_s)

    fake.reserve = spy

    async def go():
        orch = Orchestrator(fake, fake, config())
        return await collect(orch, params(sampling=Sampling(temperature=0.8)))

    run(go())
    assert len(seen) == 2 and seen[0].seed is not None and seen[0] == seen[1]
    assert fake.prefill_sampling == seen[1]  # prefill samples token 0 with the same parameters


def test_text_prompts_and_token_text_with_a_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from router.requests.text import load_tokenizer

    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    tokenizer = load_tokenizer(str(tmp_path))
    fake = two_by_two()
    fake.prompt = (3, 1, 4)

    async def go():
        orch = Orchestrator(fake, fake, config(), tokenizer=tokenizer)
        return await collect(orch, params(prompt_token_ids=None, prompt_text="w3 w1 w4", max_tokens=3))

    events, error = run(go())
    assert error is None
    assert fake.ops("reserve") and fake.manifests[0].token_interval.end == 3
    pieces = [e.text for e in events if isinstance(e, TokenOut)]
    assert "".join(pieces).split() == [f"w{t}" for t in model_tokens((3, 1, 4), 3)]


def test_a_dead_worker_is_avoided_by_the_fallback_and_by_the_next_request():
    fake = FakeCluster([worker("p0", Role.PREFILL), worker("d0", Role.DECODE), worker("d1", Role.DECODE, free=60)])
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


@pytest.mark.parametrize("mode", [Mode.COLOCATED, Mode.DISAGGREGATED])
def test_a_burst_planned_before_any_attempt_runs_spreads_over_workers(mode):
    # Four requests submitted back to back are all planned before the first one's
    # attempt task runs; each plan must count the ones before it (overlay at plan time).
    fake = FakeCluster([worker("p0", Role.PREFILL), worker("d0", Role.DECODE), worker("d1", Role.DECODE)])

    async def go():
        orch = Orchestrator(fake, fake, config())
        runs = [await orch.submit(params(request_id=f"r{i}", mode=mode)) for i in range(4)]
        await orch.drain()
        return orch, [r.plan.decode.worker_id for r in runs]

    orch, placed = run(go())
    assert sorted(placed) == ["d0", "d0", "d1", "d1"], placed
    assert_no_leaks(orch, fake)


def test_a_reused_request_id_goes_above_the_earlier_runs_generation():
    """Issue 15, item 8: a client re-using a finished request id within the directory's
    retention found transfer id r/1 taken and lost its first attempt. The router that
    served the id starts above it; another router (no memory of it) learns the
    generation from the directory's refusal and re-reserves above it, uncounted."""
    fake = two_by_two()

    async def go():
        orch = Orchestrator(fake, fake, config())
        first = await collect(orch, params())
        again = await collect(orch, params())
        other = Orchestrator(fake, fake, config())  # another replica: has not seen "r"
        third = await collect(other, params())
        return orch, other, first, again, third

    orch, other, first, again, third = run(go())
    for events, error in (first, again, third):
        assert error is None and tokens_of(events) == list(enumerate(model_tokens(PROMPT, 6)))
        done = events[-1]
        assert (done.route, done.attempts, done.failed_attempts) == (Route.DISAGGREGATED, 1, "")
    assert [s.generation for s in started(first[0])] == [1]
    assert [s.generation for s in started(again[0])] == [2]
    assert [s.generation for s in started(third[0])] == [3]  # after r/1 was refused: generation 2 ran
    assert [c[1] for c in fake.calls if c[0] == "txn_reserve"] == ["r/1", "r/2", "r/1", "r/3"]
    assert ("cancel_decode", "d1", "r", 1) in fake.calls  # the refused reservation was given back
    assert_no_leaks(orch, fake)
    assert_no_leaks(other, fake)


def test_recent_generations_are_bounded():
    from router.requests.admission import admit
    from router.requests.request_run import RecentGenerations
    cfg = config()
    mem = RecentGenerations(2)
    reqs = [admit(params(request_id=f"r{i}"), cfg, "auto", None) for i in range(3)]
    for i, req in enumerate(reqs):
        mem.note(req, i + 5)
    mem.note(reqs[1], 1)  # never goes back
    assert [mem.last(r) for r in reqs] == [0, 6, 7]


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


def test_when_only_unreachable_workers_are_left_the_request_waits_for_a_replacement():
    """Found in CI: d1 was killed while d0's lease had lapsed under load (gone from the
    snapshot for a moment); attempts 2 and 3 went straight back to d1 (connection
    refused) and the request failed while d0 was re-registering."""
    fake = FakeCluster([worker("p0", Role.PREFILL), worker("p1", Role.PREFILL), worker("d1", Role.DECODE)])
    dead = unavailable("failed to connect to all addresses; Connection refused")
    fake.fail[("reserve", "d1")] = fake.fail[("generate", "d1")] = dead

    async def go():
        orch = Orchestrator(fake, fake, config(unreachable_wait_ms=5_000, queue_poll_ms=10))
        request = asyncio.ensure_future(collect(orch, params()))
        await asyncio.sleep(0.3)
        assert not request.done()
        assert len(fake.ops("reserve", "generate")) == 1  # it waits; it does not spin on d1
        fake.cluster = Cluster((*fake.cluster.workers, worker("d0", Role.DECODE)), fake.cluster.route_epoch)
        return orch, *(await request)

    orch, events, error = run(go())
    assert error is None
    assert [c[1] for c in fake.ops("reserve")] == ["d1", "d0"]
    assert [(s.route, s.decode_worker_id) for s in started(events)] == [(Route.DISAGGREGATED, "d0")]
    assert events[-1].attempts == 2 and tokens_of(events) == list(enumerate(model_tokens(PROMPT, 6)))
    assert_no_leaks(orch, fake)


def test_the_wait_for_a_replacement_is_bounded_then_the_attempts_run_out():
    fake = FakeCluster([worker("p0", Role.PREFILL), worker("d1", Role.DECODE)])
    fake.fail[("reserve", "d1")] = fake.fail[("generate", "d1")] = unavailable("Connection refused")

    async def go():
        orch = Orchestrator(fake, fake, config(unreachable_wait_ms=300, queue_poll_ms=10))
        loop = asyncio.get_running_loop()
        start = loop.time()
        events, error = await collect(orch, params())
        return orch, events, error, loop.time() - start

    orch, events, error, took_s = run(go())
    assert error is not None and error.code is StatusCode.UNAVAILABLE
    assert error.message.startswith("all 3 attempts failed")
    assert 0.3 <= took_s < 3.0
    assert len(fake.ops("reserve", "generate")) == 3
    assert_no_leaks(orch, fake)


def test_a_colocated_worker_that_answers_beats_a_pair_with_one_that_did_not():
    fake = FakeCluster([worker("p0", Role.PREFILL), worker("d1", Role.DECODE), worker("m0", Role.MIXED)])
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
