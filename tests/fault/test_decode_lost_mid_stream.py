"""A decode worker lost mid-stream, killed (SIGKILL) or frozen (SIGSTOP), on the local
cluster (secure, ucx, `tiny`, disaggregated, no request deadline): the request never hangs
and never waits for a wrong answer.

  - with one decode worker: the client gets UNAVAILABLE naming it, within 3 s of a kill and
    within the lease + 5 s of a freeze (its connection's keepalive notices the freeze
    before the lease: router/grpc_gateway.py);
  - with two: the request moves to the other one, and every token arrives once, equal to
    an uninterrupted run's (greedy and seeded sampling), the stream stalling less than 5 s;
    the migration is counted (pd_request_migrations_total, its stall timed). The next
    attempt resumes: its prompt is the request's followed by all but the last token given
    (pd.replayed_tokens on its span), and the one it computes again matches the client's.
  - a client resumes its own stream the same way (first_step), on both routes.

Afterwards the worker is revived (SIGCONT, or started again) and nothing leaks.
"""

from __future__ import annotations

import signal
import time

import pytest

from pdserve_client import spans as S
from pdserve_client.types import PdError
from pdserve_ops import trace_view
from tests.support.cluster import assert_cluster_clean, client, start_cluster
from tests.support.metrics import scrape_process

PROMPT = list(range(3, 60))
MAX_TOKENS = 300
AT = 12  # tokens received before the worker is lost
SIGNALS = {"killed": signal.SIGKILL, "frozen": signal.SIGSTOP}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """1 prefill + 1 decode worker."""
    c = start_cluster(tmp_path_factory.mktemp("lost-single"), prefill=1, decode=1)
    yield c
    c.down()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """1 prefill + 2 decode workers."""
    c = start_cluster(tmp_path_factory.mktemp("lost-pair"), prefill=1, decode=2)
    yield c
    c.down()


def lose_decode_mid_stream(cluster, how: str, **sampling) -> tuple[list[int], list[float], float, object]:
    """Run a request, lose its decode worker after AT tokens: (tokens, their arrival times,
    the time of the signal, the result or the PdError); the worker is revived after.

    On a loaded machine the client may read so far behind the worker that the worker had
    sent its last token before the signal: nothing was lost mid-stream (one attempt, every
    token), and the run proves nothing. It is run again then, up to three times."""
    for _ in range(3):
        got = _lose_once(cluster, how, **sampling)
        outcome = got[3][1]
        if isinstance(outcome, Exception) or outcome.attempts > 1:
            return got
    pytest.fail(f"three times the decode worker had sent all {MAX_TOKENS} tokens before it was {how}")


def _lose_once(cluster, how: str, **sampling) -> tuple[list[int], list[float], float, object]:
    tokens, times, victim, t_signal, outcome = [], [], None, 0.0, None
    with client(cluster, timeout_s=120) as sdk:
        stream = sdk.generate(prompt_ids=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True, **sampling)
        try:
            for event in stream:
                tokens.append(event.token_id)
                times.append(time.monotonic())
                if len(tokens) == AT:
                    victim = stream.route.decode_worker
                    cluster.signal(victim, SIGNALS[how])
                    t_signal = time.monotonic()
            outcome = stream.result
        except PdError as e:
            outcome = e
            times.append(time.monotonic())  # when the error came
        finally:
            if victim is not None and how == "frozen":
                cluster.signal(victim, signal.SIGCONT)
    cluster.revive()
    return tokens, times, t_signal, (victim, outcome)


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_the_only_decode_worker_lost_mid_stream_fails_the_request_naming_it(single, how):
    cluster = single
    tokens, times, t_signal, (victim, error) = lose_decode_mid_stream(cluster, how)
    assert isinstance(error, PdError) and error.code == "UNAVAILABLE", error
    assert victim in str(error) and "failed to answer" in str(error), error
    took_s = times[-1] - t_signal
    limit_s = 3.0 if how == "killed" else cluster.spec.lease_ttl_s + 5.0
    assert took_s < limit_s, f"UNAVAILABLE {took_s:.1f} s after the worker was {how} ({error})"
    assert_cluster_clean(cluster)


@pytest.mark.parametrize("how", ["killed", "frozen"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_p": 0.9, "seed": 7}], ids=["greedy", "seeded"])
def test_a_request_whose_decode_worker_is_lost_mid_stream_moves_and_loses_nothing(pair, how, sampling):
    cluster = pair
    with client(cluster, timeout_s=120) as sdk:
        reference = sdk.generate_full(prompt_ids=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True, **sampling)
    before = scrape_process(cluster, "router")
    migrations_before = before.value("pd_request_migrations_total", code="UNAVAILABLE")
    stalls_before = before.value("pd_request_migration_stall_seconds_count")
    stall_sum_before = before.value("pd_request_migration_stall_seconds_sum")
    tokens, times, t_signal, (victim, result) = lose_decode_mid_stream(cluster, how, **sampling)
    assert not isinstance(result, Exception), result
    assert tokens == reference.token_ids and result.token_ids == reference.token_ids  # every token once, the same
    assert result.attempts == 2 and victim in result.failed_attempts, result
    stall = max(b - a for a, b in zip(times, times[1:]) if b > t_signal)
    assert stall < 5.0, f"the stream stalled {stall:.1f} s after its decode worker was {how}"
    router = scrape_process(cluster, "router")
    assert router.value("pd_request_migrations_total", code="UNAVAILABLE") == migrations_before + 1
    assert router.value("pd_request_migration_stall_seconds_count") == stalls_before + 1
    assert 0 < router.value("pd_request_migration_stall_seconds_sum") - stall_sum_before < 5.0
    traces, _ = trace_view.wait_for(cluster.state / S.SPANS_FILE, result.request_id, wait_s=20,
                                    expect=(S.ROUTER_MIGRATION,))
    [migration] = [sp for t in traces for sp in t.spans if sp.name == S.ROUTER_MIGRATION]
    assert migration.attributes["pd.migration.from_worker"] == victim
    assert int(migration.attributes["pd.migration.tokens_sent"]) >= AT
    assert migration.attributes["pd.migration.cause"] == "UNAVAILABLE"
    assert 0 < migration.end_ns - migration.start_ns < 5e9
    attempts = {int(sp.attributes["pd.attempt"]): sp for t in traces for sp in t.spans if sp.name == S.ROUTER_ATTEMPT}
    assert int(attempts[1].attributes[S.REPLAYED_TOKENS]) == 0
    assert int(attempts[2].attributes[S.REPLAYED_TOKENS]) == int(migration.attributes["pd.migration.tokens_sent"]) - 1
    assert_cluster_clean(cluster)


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_p": 0.9, "seed": 7}], ids=["greedy", "seeded"])
def test_a_client_resumes_its_stream_after_k_tokens_and_gets_the_rest_exactly(pair, mode, sampling):
    """The prompt followed by the k tokens a client has, with first_step k: the tokens after
    them, bit for bit those of an uninterrupted run, at several k (1, one block's edge, most)."""
    n = 40
    with client(pair, timeout_s=120) as sdk:
        whole = sdk.generate_full(prompt_ids=PROMPT, max_tokens=n, ignore_eos=True, mode=mode, **sampling).token_ids
        for k in (1, 7, 8, 39):
            rest = sdk.generate_full(prompt_ids=PROMPT + whole[:k], max_tokens=n - k, first_step=k, ignore_eos=True,
                                     mode=mode, **sampling)
            assert rest.token_ids == whole[k:], f"resumed after {k}"
        with pytest.raises(PdError, match="first_step 57 replays the whole prompt of 57 tokens") as info:
            sdk.generate_full(prompt_ids=PROMPT, max_tokens=4, first_step=len(PROMPT), mode=mode)
        assert info.value.code == "INVALID_ARGUMENT"
    assert_cluster_clean(pair)
