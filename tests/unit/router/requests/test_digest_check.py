"""The router compares the two ends' K/V digests before the decode's tokens of a hand-off
go out (docs/design.md, Security): a mismatch streams nothing of the decode's, retries, and has the
decode worker drop the published blocks from its prefix cache. Token 0 is the prefill's
own: it goes out as soon as the prefill sampled it (docs/design.md, Measurement), and a retry reproduces it."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from router.requests.orchestrator import Orchestrator
from router.types import Completed, TokenOut
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
    sealed_cluster,
    started,
    worker,
)


def _streams_nothing_retries_and_discards(fake: FakeCluster) -> None:
    """Every hand-off's digests differ: each token once, served colocated in the end, and
    the first hand-off's published K/V discarded; nothing leaked."""
    orch = Orchestrator(fake, fake, config())
    events, error = run(collect(orch, params(max_tokens=4, mode="disaggregated")))
    assert error is None
    tokens = [e for e in events if isinstance(e, TokenOut)]
    assert [(t.index, t.token_id) for t in tokens] == list(enumerate(model_tokens(PROMPT, 4)))  # once each
    first, *rest = started(events)
    assert first.prefill_worker_id == "p0" and rest and not rest[-1].prefill_worker_id  # served colocated
    assert ("cancel_decode", first.decode_worker_id, "r", first.generation, "discard_kv") in fake.calls
    assert_no_leaks(orch, fake)


def test_a_digest_mismatch_streams_nothing_retries_and_discards_the_published_kv():
    fake = FakeCluster([worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE, free=60),
                        worker("d1", WorkerRole.DECODE)])
    fake.corrupt_kv = {"d0", "d1"}  # every hand-off's digests differ; a colocated route has none
    _streams_nothing_retries_and_discards(fake)


def test_equal_digests_stream_at_once_and_discard_nothing():
    fake = FakeCluster([worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE)])
    orch = Orchestrator(fake, fake, config())
    events, error = run(collect(orch, params(max_tokens=4, mode="disaggregated")))
    assert error is None and len(started(events)) == 1
    assert not [c for c in fake.calls if c[0] == "cancel_decode" and "discard_kv" in c]
    assert_no_leaks(orch, fake)


def test_a_stream_that_ends_before_the_prefill_reply_waits_for_it():
    """Decode published, streamed and ended before Prefill returned: the held tokens and
    the complete event go out once the reply came and the digests agree."""
    fake = FakeCluster([worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE)])
    slow = fake.prefill

    async def late_prefill(w, call, timeout_s, grant=None, *more):
        done = await slow(w, call, timeout_s, grant, *more)
        await asyncio.sleep(0.2)  # the whole stream (published at the end of `slow`) is in first
        return done
    fake.prefill = late_prefill
    orch = Orchestrator(fake, fake, config())
    events, error = run(collect(orch, params(max_tokens=2, mode="disaggregated")))
    assert error is None and len(started(events)) == 1
    assert [(t.index, t.token_id) for t in events if isinstance(t, TokenOut)] == \
        list(enumerate(model_tokens(PROMPT, 2)))
    assert_no_leaks(orch, fake)


def _silent_after_publishing(fake: FakeCluster) -> None:
    """The prefill publishes, then its reply never comes (it died after its verdict)."""
    publishing = fake.prefill

    async def silent(w, call, timeout_s, grant=None, *more):
        await publishing(w, call, timeout_s, grant, *more)
        await asyncio.Future()
    fake.prefill = silent


def test_token_0_with_the_prefills_seal_over_the_decodes_digest_goes_out_without_its_reply():
    """The seal is the prefill's own word on its digest: the comparison needs no reply. A
    prefill that never replies after publishing then costs nothing (its call is cancelled
    once the stream completed), where the held token 0 would wait for the token timeout."""
    fake = sealed_cluster("d0")
    _silent_after_publishing(fake)
    orch = Orchestrator(fake, fake, config(first_token_timeout_s=5.0, cancel_timeout_s=0.05))
    events, error = run(collect(orch, params(max_tokens=4, mode="disaggregated")))
    assert error is None and len(started(events)) == 1
    assert [(t.index, t.token_id) for t in events if isinstance(t, TokenOut)] == \
        list(enumerate(model_tokens(PROMPT, 4)))
    assert any(c[0] == "cancel_prefill" for c in fake.calls)  # the silent call, ended after the stream
    (completed,) = [e for e in events if isinstance(e, Completed)]
    assert completed.prefill_kv_digest == completed.decode_kv_digest == "kv:r/1"  # the seal's word stands
    assert not [c for c in fake.calls if c[0] == "cancel_decode" and "discard_kv" in c]
    assert_no_leaks(orch, fake)


def test_without_a_seal_key_in_the_snapshot_the_decodes_tokens_wait_for_the_reply():
    fake = sealed_cluster("d0")
    fake.cluster = dataclasses.replace(fake.cluster, workers=tuple(
        dataclasses.replace(w, seal_key=b"") for w in fake.cluster.workers))
    _silent_after_publishing(fake)
    orch = Orchestrator(fake, fake, config(first_token_timeout_s=0.3, cancel_timeout_s=0.05, max_attempts=1,
                                           max_disaggregated_attempts=1))
    events, error = run(collect(orch, params(max_tokens=4, mode="disaggregated")))
    # The prefill's token 0 went out; the decode's were held, then the attempt timed out.
    assert [(t.index, t.token_id) for t in events if isinstance(t, TokenOut)] == [(0, model_tokens(PROMPT, 1)[0])]
    assert error is not None


def test_token_0_goes_out_as_the_prefill_samples_it_before_the_hand_off_ends():
    """The prefill sampled token 0 and its hand-off never ends: the client has token 0 at
    once; the attempt times out, the colocated retry reproduces token 0 (not sent twice)
    and streams the rest."""
    fake = FakeCluster([worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE)])

    async def stuck(w, call, timeout_s, grant=None, on_first_token=None, job_sent=None):
        job_sent.set_result(None)
        call = await grant
        on_first_token(model_tokens(call.prompt_token_ids, 1)[0])
        await asyncio.Future()  # never publishes, never replies
    fake.prefill = stuck
    orch = Orchestrator(fake, fake, config(first_token_timeout_s=0.3, cancel_timeout_s=0.05))
    calls_at_token_0: list[list] = []

    async def watch():
        events = []
        async for ev in orch.generate(params(max_tokens=3, mode="disaggregated")):
            if isinstance(ev, TokenOut) and ev.index == 0:
                calls_at_token_0.append([c[0] for c in fake.calls])
            events.append(ev)
        await orch.drain()
        return events, None
    events, error = run(watch())
    assert error is None
    assert [(t.index, t.token_id) for t in events if isinstance(t, TokenOut)] == \
        list(enumerate(model_tokens(PROMPT, 3)))
    (calls,) = calls_at_token_0
    assert "generate" not in calls and "cancel_prefill" not in calls  # the hand-off was still running
    first, *rest = started(events)
    assert first.prefill_worker_id == "p0" and rest and not rest[-1].prefill_worker_id  # served colocated
    assert_no_leaks(orch, fake)


@pytest.mark.parametrize("fault", ["forged seal", "decode digest differs"])
def test_a_seal_that_does_not_open_over_the_decodes_digest_is_a_mismatch(fault):
    fake = sealed_cluster("d0", "d1", forged=fault == "forged seal")
    if fault == "decode digest differs":
        fake.corrupt_kv = {"d0", "d1"}
    _streams_nothing_retries_and_discards(fake)


def test_a_reply_that_trails_the_sealed_stream_is_still_counted_and_learned_from():
    """Token 0 went out by the seal and the stream completed before the Prefill replied:
    the reply, settled after the complete event, counts the hand-off like one that came first."""
    fake = sealed_cluster("d0")
    replying = fake.prefill

    async def late(w, call, timeout_s, grant=None, *more):
        done = await replying(w, call, timeout_s, grant, *more)
        await asyncio.sleep(0.2)  # the whole stream goes out meanwhile
        return done
    fake.prefill = late
    orch = Orchestrator(fake, fake, config(cancel_timeout_s=2.0))
    events, error = run(collect(orch, params(max_tokens=2, mode="disaggregated")))
    assert error is None and len(started(events)) == 1
    assert orch.metrics.registry.get_sample_value("pd_kv_transfer_completions_total") == 1
    assert not any(c[0] == "cancel_prefill" for c in fake.calls)
    assert_no_leaks(orch, fake)
