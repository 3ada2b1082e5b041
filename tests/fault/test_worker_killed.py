"""A worker SIGKILLed between reserve and publish: the request still completes.

Prefill workers here wait 2 s between compute and send (PD_FAULT_DELAY_BEFORE_SEND_S),
which is the window between reserve and publish. The test reads the router's
`started` event to learn which workers hold the request, kills one of them,
and expects: completion through a retry (or colocated fallback) with tokens
equal to a colocated run, the dead worker's reservations reclaimed, and no
leaked block or open transaction on the survivors.
"""

from __future__ import annotations

import random

import pytest

from pdserve_client.rpc.pd.v1 import common_pb2, router_pb2, router_pb2_grpc
from tests.support.cluster import assert_cluster_clean, channel, client, start_cluster

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("killed"), prefill=2, decode=2, lease_ttl_s=2.0,
                      env={"PD_FAULT_DELAY_BEFORE_SEND_S": "2.0"})
    yield c
    c.down()


@pytest.fixture
def cluster(module_cluster):
    """The module's cluster, whole again after each test (the killed worker restarted)."""
    yield module_cluster
    module_cluster.revive()


def generate_killing(cluster, prompt: list[int], victim_role: str):
    """Run one disaggregated request; SIGKILL its `victim_role` worker after `started`."""
    request = router_pb2.GenerateRequest(
        request_id=f"kill-{victim_role}", prompt_token_ids=common_pb2.TokenIds(ids=prompt),
        max_tokens=MAX_TOKENS, mode=router_pb2.MODE_DISAGGREGATED,
        sampling=common_pb2.SamplingParams(ignore_eos=True), deadline_ms=60_000)
    killed, tokens, complete, started = None, [], None, []
    with channel(cluster, "router", "client") as ch:
        for event in router_pb2_grpc.RouterStub(ch).Generate(request, timeout=90):
            kind = event.WhichOneof("event")
            if kind == "started":
                started.append(event.started)
                if killed is None:
                    killed = (event.started.prefill_worker_id if victim_role == "prefill"
                              else event.started.decode_worker_id)
                    cluster.signal(killed)
            elif kind == "token":
                tokens.append(event.token.token_id)
            elif kind == "complete":
                complete = event.complete
    return killed, tokens, complete, started


@pytest.mark.parametrize("victim_role", ["prefill", "decode"])
def test_worker_killed_between_reserve_and_publish(cluster, victim_role):
    prompt = [random.Random(5).randrange(3, 500) for _ in range(150)]
    killed, tokens, complete, started = generate_killing(cluster, prompt, victim_role)
    assert killed and not cluster.alive()[killed]
    assert complete is not None and complete.attempts >= 2
    assert len(tokens) == MAX_TOKENS
    # The retry ran on workers other than the dead one.
    last = started[-1]
    assert killed not in (last.prefill_worker_id, last.decode_worker_id)
    with client(cluster) as sdk:
        reference = sdk.generate_full(prompt_ids=prompt, max_tokens=MAX_TOKENS,
                                         mode="colocated", ignore_eos=True)
    assert tokens == reference.token_ids
    # The dead worker's lease expires, its transactions are aborted, survivors are clean.
    assert_cluster_clean(cluster, timeout_s=20)
