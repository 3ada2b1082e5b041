"""Token 0 of a disaggregated request leaves from the prefill as soon as it is sampled
(docs/design.md, Measurement): the client has it while the hand-off still runs, and the request's tokens are
a colocated run's.

The prefill waits PAUSE_S after its compute, before its first chunk leaves, for a request
whose id names "@computed" (PD_FAULT_PAUSE_S): its token 0 must reach the client within
that pause, its token 1 only after it. The same with the decode holding its Reserve
("@reserved"): token 0 does not wait for the grant either.
"""

from __future__ import annotations

import random

import pytest

from pdserve_client.rpc.pd.v1 import common_pb2, router_pb2
from tests.support.cluster import assert_cluster_clean, router_events, start_cluster

PAUSE_S = 3.0
PROMPT = [random.Random(21).randrange(3, 500) for _ in range(40)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("token0"), prefill=1, decode=1, transport="ucx",
                      env={"PD_FAULT_PAUSE_S": str(PAUSE_S)})
    yield c
    c.down()


def generate(cluster, request_id: str, mode):
    """One request: its Started events, tokens, each token's arrival (s from the call) and
    its Complete event."""
    return router_events(cluster, router_pb2.GenerateRequest(
        request_id=request_id, prompt_token_ids=common_pb2.TokenIds(ids=PROMPT), max_tokens=6, mode=mode,
        sampling=common_pb2.SamplingParams(ignore_eos=True), deadline_ms=60_000))


def test_token_0_reaches_the_client_while_the_hand_off_waits(cluster):
    _, want, _, _ = generate(cluster, "colocated", router_pb2.MODE_COLOCATED)
    started, tokens, times, complete = generate(cluster, "split@computed", router_pb2.MODE_DISAGGREGATED)
    assert [s.route for s in started] == [router_pb2.ROUTE_DISAGGREGATED] and complete.attempts == 1
    assert tokens == want  # exact: the prefill's token 0 and the decode's tokens are a colocated run's
    assert times[0] < PAUSE_S / 2, times  # token 0 did not wait for the hand-off
    assert times[1] > PAUSE_S, times  # token 1 did: the decode had no K/V before the pause ended
    assert complete.prefill_kv_digest == complete.decode_kv_digest
    assert_cluster_clean(cluster)


def test_token_0_does_not_wait_for_the_decodes_reserve(cluster):
    """The decode holds its Reserve PAUSE_S ("@reserved"): the prefill computes its job
    meanwhile, and its token 0 is read and streamed without waiting for the grant."""
    _, want, _, _ = generate(cluster, "colocated-reserve", router_pb2.MODE_COLOCATED)
    started, tokens, times, complete = generate(cluster, "split@reserved", router_pb2.MODE_DISAGGREGATED)
    assert [s.route for s in started] == [router_pb2.ROUTE_DISAGGREGATED] and complete.attempts == 1
    assert tokens == want
    assert times[0] < PAUSE_S / 2, times
    assert times[1] > PAUSE_S, times  # the decode reserved, then the hand-off ran
    assert_cluster_clean(cluster)
