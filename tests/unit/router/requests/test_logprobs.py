"""Log-probabilities through the router (Sampling.logprobs): admitted in 0..20, carried both
ways by router/convert.py, and out on every TokenOut over the fake cluster
(tests/support/orchestrator.py `model_logprobs`): a hand-off's token 0 the prefill's (the
decode did not sample it, so its token 0 waits for the prefill's when that comes late), a
colocated run's, and a migrated stream's, each index once."""

from __future__ import annotations

import pytest

from pdserve_client.rpc.pd.v1 import common_pb2, decode_pb2, router_pb2
from router import convert
from router.config import RouterConfig
from router.requests.admission import admit
from router.requests.orchestrator import Orchestrator
from router.types import (
    GenerateParams,
    Mode,
    Route,
    RouterError,
    Sampling,
    StatusCode,
    StreamToken,
    TokenLogprobs,
    TokenOut,
    WorkerCallError,
)
from runtime.directory.records import WorkerRole
from tests.support.orchestrator import (
    PROMPT,
    FakeCluster,
    assert_no_leaks,
    collect,
    config,
    model_logprobs,
    model_tokens,
    params,
    run,
    sealed_cluster,
    started,
    two_by_two,
    worker,
)

LP = TokenLogprobs(-0.5, ((7, -0.25), (3, -0.5)))


@pytest.mark.parametrize("k", [None, 0, 5, 20])
def test_admission_takes_0_to_20(k):
    a = admit(GenerateParams(prompt_token_ids=(1, 2), max_tokens=2, sampling=Sampling(logprobs=k)), RouterConfig(),
              Route.COLOCATED)
    assert a.sampling.logprobs == k


@pytest.mark.parametrize("k", [-1, 21])
def test_admission_refuses_more_than_20_naming_the_limit(k):
    with pytest.raises(RouterError, match=rf"sampling.logprobs must be in 0..20 .*got {k}") as info:
        admit(GenerateParams(prompt_token_ids=(1, 2), max_tokens=2, sampling=Sampling(logprobs=k)), RouterConfig(),
              Route.COLOCATED)
    assert info.value.code is StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("k", [None, 0, 3])
def test_sampling_converts_both_ways_unset_staying_unset(k):
    pb = convert.sampling_to_pb(Sampling(logprobs=k))
    assert pb.HasField("logprobs") is (k is not None)
    assert convert.sampling_from_pb(pb).logprobs == k
    request = router_pb2.GenerateRequest(prompt_token_ids=common_pb2.TokenIds(ids=[1]), sampling=pb)
    assert convert.generate_params_from_pb(request).sampling.logprobs == k  # the gRPC intake's way


def test_token_events_carry_them_in_and_out():
    pb = convert.logprobs_to_pb(LP)
    Token = decode_pb2.TokenEvent.Token
    ev = decode_pb2.TokenEvent(request_id="r", token=Token(token_id=3, index=1, logprobs=pb))
    assert convert.token_event_from_pb(ev) == StreamToken(3, 1, logprobs=LP)
    bare = decode_pb2.TokenEvent(request_id="r", token=Token(token_id=3, index=0))
    assert convert.token_event_from_pb(bare).logprobs is None
    out = convert.event_to_pb("r", TokenOut(3, "x", 1, 2.0, logprobs=LP)).token
    assert (out.logprobs.logprob, list(out.logprobs.top_token_ids), list(out.logprobs.top_logprobs)) == \
        (-0.5, [7, 3], [-0.25, -0.5])
    assert not convert.event_to_pb("r", TokenOut(3, "x", 1, 2.0)).token.HasField("logprobs")
    pb.top_logprobs.append(-1.0)
    with pytest.raises(WorkerCallError, match="2 top ids and 3 top logprobs") as info:
        convert.logprobs_from_pb(pb)
    assert info.value.code is StatusCode.INTERNAL


def _expected(n: int, k: int | None, prompt=PROMPT) -> list[tuple[int, int, TokenLogprobs | None]]:
    return [(i, t, model_logprobs(t, i, k)) for i, t in enumerate(model_tokens(prompt, n))]


def _tokens(events) -> list[tuple[int, int, TokenLogprobs | None]]:
    return [(e.index, e.token_id, e.logprobs) for e in events if isinstance(e, TokenOut)]


@pytest.mark.parametrize("mode", [Mode.DISAGGREGATED, Mode.COLOCATED])
@pytest.mark.parametrize("k", [None, 0, 4])
def test_every_token_out_carries_its_logprobs(mode, k):
    fake = two_by_two()
    orch = Orchestrator(fake, fake, config())
    events, error = run(collect(orch, params(max_tokens=5, mode=mode, sampling=Sampling(logprobs=k))))
    assert error is None and _tokens(events) == _expected(5, k)
    first = next(e for e in events if isinstance(e, TokenOut))
    assert first.decoding is (mode is Mode.COLOCATED)  # split: the prefill's token 0, with the prefill's values
    assert_no_leaks(orch, fake)


def test_a_migrated_stream_gives_each_index_once_with_its_logprobs():
    fake = two_by_two()
    fake.break_after["d1"] = 3
    orch = Orchestrator(fake, fake, config())
    events, error = run(collect(orch, params(max_tokens=8, sampling=Sampling(logprobs=2))))
    assert error is None and [s.generation for s in started(events)] == [1, 2]
    assert _tokens(events) == _expected(8, 2)  # the resumed attempt's replayed token suppressed, values and all
    assert fake.prefill_sampling.first_step == 2 and fake.prefill_sampling.logprobs == 2
    assert_no_leaks(orch, fake)


def test_a_sealed_decode_token_0_waits_for_the_prefills_when_logprobs_are_asked():
    """The decode's token 0 (with the prefill's seal, no logprobs: it did not sample it)
    comes before the prefill's FirstToken: held, so the client's token 0 is the prefill's."""
    fake = sealed_cluster("d0")
    fake.token_0_late_s = 0.1
    orch = Orchestrator(fake, fake, config())
    events, error = run(collect(orch, params(max_tokens=4, sampling=Sampling(logprobs=1))))
    assert error is None and len(started(events)) == 1
    assert _tokens(events) == _expected(4, 1)
    assert not next(e for e in events if isinstance(e, TokenOut)).decoding
    assert_no_leaks(orch, fake)


def test_without_logprobs_the_sealed_decode_token_0_goes_out_at_once():
    fake = sealed_cluster("d0")
    fake.token_0_late_s = 0.1
    orch = Orchestrator(fake, fake, config())
    events, error = run(collect(orch, params(max_tokens=4, mode="disaggregated")))
    assert error is None and _tokens(events) == _expected(4, None)
    assert next(e for e in events if isinstance(e, TokenOut)).decoding  # the decode's came first, as before
    assert_no_leaks(orch, fake)


def test_a_colocated_only_cluster_gives_them_too():
    fake = FakeCluster([worker("w0", WorkerRole.MIXED)])
    orch = Orchestrator(fake, fake, config())
    events, error = run(collect(orch, params(max_tokens=3, sampling=Sampling(logprobs=0))))
    assert error is None and _tokens(events) == _expected(3, 0)
    assert_no_leaks(orch, fake)
