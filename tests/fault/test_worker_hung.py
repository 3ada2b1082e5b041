"""A decode worker hung mid-stream (SIGSTOP) is noticed within seconds.

Real processes (2 decode workers, tiny, colocated requests), router token timeout
raised to 120 s: the request can finish well before that only if the router notices the
stopped worker, by whichever comes first of its lease expiring (2 s here; the attempt's
liveness check, router/requests/attempt_drive.py) and its call's keepalive ping going
unanswered (~3 s, router/grpc_gateway.py): SIGSTOP freezes gRPC's threads too, and under
load either may win. The request then completes on the other worker with the same
tokens; once the hung worker resumes it finds its lease lost, registers again, and
nothing leaks.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.cluster import assert_cluster_clean, client, start_cluster

PROMPT = list(range(3, 60))
MAX_TOKENS = 300


@pytest.fixture
def cluster(tmp_path):
    c = start_cluster(tmp_path, prefill=0, decode=2, mode="colocated", lease_ttl_s=2.0,
                      env={"PD_ROUTER_TOKEN_TIMEOUT_S": "120", "PD_ROUTER_FIRST_TOKEN_TIMEOUT_S": "120"})
    yield c
    c.down()


def test_a_stopped_decode_worker_is_noticed_within_seconds(cluster):
    with client(cluster, timeout_s=180) as sdk:
        reference = sdk.generate_full(prompt_ids=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True)
        stream = sdk.generate(prompt_ids=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True,
                                 request_id="hung-worker")
        victim, tokens = None, []
        started = time.monotonic()
        for event in stream:
            tokens.append(event.token_id)
            if victim is None and len(tokens) == 5:
                victim = stream.route.decode_worker
                cluster.signal(victim, signal.SIGSTOP)
        elapsed = time.monotonic() - started
        result = stream.result
    try:
        assert tokens == reference.token_ids and result.token_ids == reference.token_ids
        assert result.attempts == 2, result
        failed = result.failed_attempts
        by_lease = f"{victim}'s lease" in failed and "dead or hung" in failed
        by_ping = f"on {victim}" in failed and "ping timeout" in failed
        assert by_lease or by_ping, failed
        assert elapsed < 60, f"took {elapsed:.0f} s: noticed by the token timeout, not by the lease or the ping"
    finally:
        cluster.signal(victim, signal.SIGCONT)
    assert_cluster_clean(cluster, timeout_s=30)
