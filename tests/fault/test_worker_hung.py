"""A decode worker hung mid-stream (SIGSTOP) is noticed when its lease expires.

Real processes (2 decode workers, tiny, colocated requests), router token timeout
raised to 120 s: the only way the request can finish well before that is the router
noticing the stopped worker's lease expire (router/requests/attempts.py, liveness check).
The request then completes on the other worker with the same tokens; once the hung
worker resumes it finds its lease lost, registers again, and nothing leaks.
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


def test_a_stopped_decode_worker_is_noticed_by_its_lease(cluster):
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
        assert f"{victim}'s lease" in result.failed_attempts and "dead or hung" in result.failed_attempts
        assert elapsed < 60, f"took {elapsed:.0f} s: noticed by a timeout, not by the lease"
    finally:
        cluster.signal(victim, signal.SIGCONT)
    assert_cluster_clean(cluster, timeout_s=30)
