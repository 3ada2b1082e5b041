"""The router compares the two ends' K/V digests before token 0 of a hand-off goes out
(issue 17, item 7): a mismatch streams nothing, retries, and has the decode worker drop
the published blocks from its prefix cache."""

from __future__ import annotations

import asyncio

from router.requests.orchestrator import Orchestrator
from router.types import Role, TokenOut
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
    worker,
)


def test_a_digest_mismatch_streams_nothing_retries_and_discards_the_published_kv():
    fake = FakeCluster([worker("p0", Role.PREFILL), worker("d0", Role.DECODE, free=60),
                        worker("d1", Role.DECODE)])
    fake.corrupt_kv = {"d0", "d1"}  # every hand-off's digests differ; a colocated route has none
    orch = Orchestrator(fake, fake, config())
    events, error = run(collect(orch, params(max_tokens=4, mode="disaggregated")))
    assert error is None
    tokens = [e for e in events if isinstance(e, TokenOut)]
    assert [(t.index, t.token_id) for t in tokens] == list(enumerate(model_tokens(PROMPT, 4)))  # once each
    first, *rest = started(events)
    assert first.prefill_worker_id == "p0" and rest and not rest[-1].prefill_worker_id  # served colocated
    assert ("cancel_decode", first.decode_worker_id, "r", first.generation, "discard_kv") in fake.calls
    assert_no_leaks(orch, fake)


def test_equal_digests_stream_at_once_and_discard_nothing():
    fake = FakeCluster([worker("p0", Role.PREFILL), worker("d0", Role.DECODE)])
    orch = Orchestrator(fake, fake, config())
    events, error = run(collect(orch, params(max_tokens=4, mode="disaggregated")))
    assert error is None and len(started(events)) == 1
    assert not [c for c in fake.calls if c[0] == "cancel_decode" and "discard_kv" in c]
    assert_no_leaks(orch, fake)


def test_a_stream_that_ends_before_the_prefill_reply_waits_for_it():
    """Decode published, streamed and ended before Prefill returned: the held tokens and
    the complete event go out once the reply came and the digests agree."""
    fake = FakeCluster([worker("p0", Role.PREFILL), worker("d0", Role.DECODE)])
    slow = fake.prefill

    async def late_prefill(w, call, timeout_s, grant=None):
        done = await slow(w, call, timeout_s, grant)
        await asyncio.sleep(0.2)  # the whole stream (published at the end of `slow`) is in first
        return done
    fake.prefill = late_prefill
    orch = Orchestrator(fake, fake, config())
    events, error = run(collect(orch, params(max_tokens=2, mode="disaggregated")))
    assert error is None and len(started(events)) == 1
    assert [(t.index, t.token_id) for t in events if isinstance(t, TokenOut)] == \
        list(enumerate(model_tokens(PROMPT, 2)))
    assert_no_leaks(orch, fake)
