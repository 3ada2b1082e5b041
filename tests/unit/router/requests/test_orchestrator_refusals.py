"""Router orchestration over an in-process fake cluster (tests/support/orchestrator.py):
what a request is refused, or waits out, before or between attempts: invalid
parameters, no (big enough) worker, resource exhaustion everywhere, and only
unreachable workers left (a bounded wait for a replacement). Every lifecycle test
ends with a leak check."""

from __future__ import annotations

import asyncio

import pytest

from router.requests.orchestrator import Orchestrator
from router.types import Mode, Route, RouterError, Sampling, Slo, StatusCode, WorkerCallError
from runtime.directory.records import ClusterSnapshot, WorkerCapacity, WorkerRecord, WorkerRole
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
    # Limits in bytes, not characters (docs/design.md, Failures): 65 four-byte characters.
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


def test_a_checkpoint_without_tokenizer_json_refuses_text_prompts(tmp_path):
    from router.requests.text import load_tokenizer

    (tmp_path / "config.json").write_text("{}")
    tokenizer = load_tokenizer(str(tmp_path))
    fake = two_by_two()

    async def go():
        orch = Orchestrator(fake, fake, config(), tokenizer=tokenizer)
        with pytest.raises(RouterError) as err:
            await orch.submit(params(prompt_token_ids=None, prompt_text="hello"))
        return orch, err.value

    orch, error = run(go())
    assert tokenizer is None and error.code is StatusCode.INVALID_ARGUMENT
    assert "prompt_text needs a tokenizer, and this router has none" in error.message, error.message
    assert not [c for c in fake.calls if c[0] != "snapshot"] and orch.in_flight == 0


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
    fake = FakeCluster([worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE)])
    fake.cluster = ClusterSnapshot(tuple(w if w.can_prefill else WorkerRecord(
        w.worker_id, w.role, w.grpc_address, capacity=WorkerCapacity(total_blocks=3, block_size=4))
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
    """Workers full although their heartbeats show room: each refusal fences that worker
    full and the retry goes to another; with none left the request waits in the admission
    queue (docs/architecture.md, Router retries and the admission queue), and is refused
    once its deadline can no longer be met."""
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


def test_when_only_unreachable_workers_are_left_the_request_waits_for_a_replacement():
    """Found in CI: d1 was killed while d0's lease had lapsed under load (gone from the
    snapshot for a moment); attempts 2 and 3 went straight back to d1 (connection
    refused) and the request failed while d0 was re-registering."""
    fake = FakeCluster([worker("p0", WorkerRole.PREFILL), worker("p1", WorkerRole.PREFILL),
                        worker("d1", WorkerRole.DECODE)])
    dead = unavailable("failed to connect to all addresses; Connection refused")
    fake.fail[("reserve", "d1")] = fake.fail[("generate", "d1")] = dead

    async def go():
        orch = Orchestrator(fake, fake, config(unreachable_wait_ms=5_000, queue_poll_ms=10))
        request = asyncio.ensure_future(collect(orch, params()))
        await asyncio.sleep(0.3)
        assert not request.done()
        assert len(fake.ops("reserve", "generate")) == 1  # it waits; it does not spin on d1
        fake.cluster = ClusterSnapshot((*fake.cluster.workers, worker("d0", WorkerRole.DECODE)),
                                       fake.cluster.route_epoch)
        return orch, *(await request)

    orch, events, error = run(go())
    assert error is None
    assert [c[1] for c in fake.ops("reserve")] == ["d1", "d0"]
    assert [(s.route, s.decode_worker_id) for s in started(events)] == [(Route.DISAGGREGATED, "d0")]
    assert events[-1].attempts == 2 and tokens_of(events) == list(enumerate(model_tokens(PROMPT, 6)))
    assert_no_leaks(orch, fake)


def test_the_wait_for_a_replacement_is_bounded_then_the_request_fails_naming_the_worker():
    """Once the wait for another worker is over, the request fails UNAVAILABLE naming the one
    that did not answer, instead of dispatching into its address again (a frozen worker's
    connection hangs: its attempts would each take a connect timeout)."""
    fake = FakeCluster([worker("p0", WorkerRole.PREFILL), worker("d1", WorkerRole.DECODE)])
    fake.fail[("reserve", "d1")] = fake.fail[("generate", "d1")] = unavailable("Connection refused")

    async def go():
        orch = Orchestrator(fake, fake, config(unreachable_wait_ms=300, queue_poll_ms=10))
        loop = asyncio.get_running_loop()
        start = loop.time()
        events, error = await collect(orch, params())
        return orch, events, error, loop.time() - start

    orch, events, error, took_s = run(go())
    assert error is not None and error.code is StatusCode.UNAVAILABLE
    assert error.message.startswith("d1 failed to answer and no other worker could take the request (waited 0.3 s")
    assert "Connection refused" in error.message
    assert 0.3 <= took_s < 3.0
    assert len(fake.ops("reserve", "generate")) == 1
    assert_no_leaks(orch, fake)


@pytest.mark.parametrize("still_listed", [True, False], ids=["listed", "dropped by the directory"])
def test_the_only_decode_worker_dying_mid_stream_fails_the_request_naming_it(still_listed):
    """Its last heartbeat shows its blocks held, and no heartbeat will show them freed: the
    retry does not wait for K/V room there (or, once the directory dropped it, for room
    anywhere) until the deadline, but for another worker, unreachable_wait_ms at most;
    then UNAVAILABLE naming the worker and what its stream said."""
    fake = FakeCluster([worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE, free=64)])
    fake.break_after["d0"] = 3

    def heartbeat_lost(i: int) -> None:
        if i == 2:  # the last report it sends: its pool full with this very request
            others = [w for w in fake.cluster.workers if w.worker_id != "d0"]
            gone = [worker("d0", WorkerRole.DECODE, free=0)] if still_listed else []
            fake.cluster = ClusterSnapshot((*others, *gone), fake.cluster.route_epoch)
    fake.after_token = heartbeat_lost

    async def go():
        orch = Orchestrator(fake, fake, config(unreachable_wait_ms=300, queue_poll_ms=10))
        loop = asyncio.get_running_loop()
        start = loop.time()
        events, error = await collect(orch, params(deadline_ms=60_000, max_tokens=20))
        return orch, events, error, loop.time() - start

    orch, events, error, took_s = run(go())
    assert error is not None and error.code is StatusCode.UNAVAILABLE, error
    assert error.message.startswith("d0 failed to answer") and "d0 died mid-stream" in error.message, error
    assert took_s < 3.0, took_s
    assert orch.queue.waiting == 0
    assert_no_leaks(orch, fake)
