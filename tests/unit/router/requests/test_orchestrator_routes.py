"""Router orchestration over an in-process fake cluster (tests/support/orchestrator.py):
the routes a request takes when its first attempt works (disaggregated, colocated by
mode, config or cluster), its seed and text, how a burst spreads, and the generation
a request id gets. Every lifecycle test ends with a leak check: nothing in flight,
no overlay entries, no open transaction."""

from __future__ import annotations

import hashlib
import struct

import pytest

from router.requests.orchestrator import Orchestrator
from router.types import Completed, FinishReason, Mode, Route, Sampling, Started, TokenOut
from runtime.directory.records import WorkerRole
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
    # one-way: the record before what needs it; then in the order they are needed: P's
    # grant (its compute is the critical path), the stream (its capability has D consume
    # the nonce before P's AUTH, most often)
    assert [c[0] for c in fake.calls] == ["reserve", "txn_reserve", "prefill", "decode_stream"]
    m = fake.manifests[0]
    assert (m.request_id, m.tenant, m.generation, m.attempt, m.transfer_id, m.reservation_id) == \
        ("r", "t", 1, 1, "r/1", "r/1")
    assert m.prompt_digest == hashlib.sha256(b"t\0" + struct.pack("<9I", *PROMPT)).hexdigest()  # tenant-keyed
    assert (m.token_interval.start, m.token_interval.end, m.block_size) == (4, 9, 4)  # 1 visible prefix block of 4
    assert (m.source_worker_id, m.source_epoch, m.destination_worker_id, m.destination_epoch) == ("p0", 5, "d1", 5)
    assert (m.route_epoch, m.cache_abi_digest, m.checksum_algorithm) == (7, "abi-1", "gmac-aes256-64")
    assert_no_leaks(orch, fake)


def test_without_prefill_workers_disaggregated_requests_run_colocated():
    fake = FakeCluster([worker("d0", WorkerRole.DECODE), worker("d1", WorkerRole.DECODE, free=10)])

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

    async def go():
        orch = Orchestrator(fake, fake, config(), tokenizer=tokenizer)
        return await collect(orch, params(prompt_token_ids=None, prompt_text="w3 w1 w4", max_tokens=3))

    events, error = run(go())
    assert error is None
    assert fake.ops("reserve") and fake.manifests[0].token_interval.end == 3
    pieces = [e.text for e in events if isinstance(e, TokenOut)]
    assert "".join(pieces).split() == [f"w{t}" for t in model_tokens((3, 1, 4), 3)]


def test_text_prompts_and_token_text_on_a_preset():
    from router.requests.text import load_tokenizer

    tokenizer = load_tokenizer("tiny")  # the preset's own (runtime/engine/preset_tokenizer.py)
    prompt = tuple(tokenizer.encode("Hello, world").ids)
    fake = two_by_two()

    async def go():
        orch = Orchestrator(fake, fake, config(), tokenizer=tokenizer)
        return orch, await collect(orch, params(prompt_token_ids=None, prompt_text="Hello, world", max_tokens=5))

    orch, (events, error) = run(go())
    assert error is None and prompt[0] == 1  # <s> first
    out = model_tokens(prompt, 5)
    assert [t for _, t in tokens_of(events)] == out
    streamed = "".join(e.text for e in events if isinstance(e, TokenOut))
    assert tokenizer.decode(out, skip_special_tokens=True).startswith(streamed)
    assert_no_leaks(orch, fake)


@pytest.mark.parametrize("mode", [Mode.COLOCATED, Mode.DISAGGREGATED])
def test_a_burst_planned_before_any_attempt_runs_spreads_over_workers(mode):
    # Four requests submitted back to back are all planned before the first one's
    # attempt task runs; each plan must count the ones before it (overlay at plan time).
    fake = FakeCluster([worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE),
                        worker("d1", WorkerRole.DECODE)])

    async def go():
        orch = Orchestrator(fake, fake, config())
        runs = [await orch.submit(params(request_id=f"r{i}", mode=mode)) for i in range(4)]
        await orch.drain()
        return orch, [r.plan.decode.worker_id for r in runs]

    orch, placed = run(go())
    assert sorted(placed) == ["d0", "d0", "d1", "d1"], placed
    assert_no_leaks(orch, fake)


def test_a_reused_request_id_goes_above_the_earlier_runs_generation():
    """A client re-using a finished request id within the directory's retention used to
    find transfer id r/1 taken and lose its first attempt. The router that
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
    # After r/1 was refused (generation 2 ran) it runs at 3; the prefill's token 0 at generation 1 may
    # have gone out before the refusal (it leaves as soon as it is read), and 3 reproduced it.
    assert [s.generation for s in started(third[0])][-1] == 3
    assert {s.generation for s in started(third[0])} <= {1, 3}
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
