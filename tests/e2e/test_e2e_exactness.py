"""End to end on the real local cluster: disaggregated == colocated, K/V hand-off exact.

200 seeded requests (prompts of 1-512 tokens, some sharing prefixes, 8 at a
time) go through the router once disaggregated and once colocated, on a
cluster whose data plane is ucx, then on one whose data plane is tcp. Greedy
tokens must be identical, and for every disaggregated request the K/V digest
the decode worker published must equal the one the prefill worker produced.
"""

from __future__ import annotations

import os

import pytest

from tests.support.cluster import assert_cluster_clean, generate_all, seeded_requests, start_cluster

N_REQUESTS = int(os.environ.get("PD_TEST_EXACTNESS_REQUESTS", "200"))
"""Seeded requests per mode (tests/integration/test_isa_matrix.py reruns this test with
fewer under AVX2-limited MKL/oneDNN: there the ISA is what varies, not the traffic)."""
MAX_TOKENS = 12


@pytest.fixture(scope="module", params=["ucx", "tcp"])
def cluster(request, tmp_path_factory):
    """The data plane under test: ucx (shared memory here) and the tcp fallback."""
    c = start_cluster(tmp_path_factory.mktemp("e2e"), prefill=1, decode=2, num_blocks=1024,
                      transport=request.param)
    yield c
    c.down()


def run_all(cluster, prompts: list[list[int]], mode: str):
    return generate_all(cluster, prompts, max_tokens=MAX_TOKENS, mode=mode, ignore_eos=True, deadline_s=120)


def test_disaggregated_equals_colocated_with_exact_handoff(cluster):
    prompts = seeded_requests(N_REQUESTS, seed=2026)
    disagg = run_all(cluster, prompts, "disaggregated")
    coloc = run_all(cluster, prompts, "colocated")
    assert [r.route for r in disagg] == ["disaggregated"] * N_REQUESTS
    assert [r.route for r in coloc] == ["colocated"] * N_REQUESTS
    mismatched = [i for i, (a, b) in enumerate(zip(disagg, coloc)) if a.token_ids != b.token_ids]
    assert not mismatched, f"{len(mismatched)} requests differ, first {mismatched[:5]}"
    assert all(len(r.token_ids) == MAX_TOKENS for r in disagg)
    for r in disagg:
        assert r.prefill_kv_digest and r.prefill_kv_digest == r.decode_kv_digest, r.request_id
    assert_cluster_clean(cluster)


@pytest.mark.parametrize("max_tokens", [1, 2])
def test_shortest_outputs_succeed_disaggregated_at_the_first_attempt(cluster, max_tokens):
    """A 1-token request finishes at publication, possibly before its DecodeStream call
    arrives: the tokens wait for the stream, and no attempt fails."""
    prompts = seeded_requests(20, seed=max_tokens, max_prompt=300)
    results = generate_all(cluster, prompts, max_tokens=max_tokens, mode="disaggregated",
                           ignore_eos=True)
    failed = [(r.attempts, r.failed_attempts) for r in results if r.attempts != 1 or r.failed_attempts]
    assert not failed, failed
    assert all(r.route == "disaggregated" and len(r.token_ids) == max_tokens for r in results)
    assert all(r.prefill_kv_digest == r.decode_kv_digest for r in results)
    assert_cluster_clean(cluster)


def test_a_reused_request_id_is_served_at_its_first_attempt(cluster):
    """Re-using a finished request id within the directory's retention used to fail the
    first attempt (transfer id r/1 already taken). The router that served it
    goes above its last generation; a restarted router (no memory) learns the generation
    from the directory's refusal and re-reserves above it without counting a failure."""
    prompt = seeded_requests(1, seed=77, max_prompt=200)[0]
    rid = f"reused-{cluster.spec.transport}"

    def once():
        [r] = generate_all(cluster, [prompt], max_tokens=4, mode="disaggregated",
                           ignore_eos=True, request_id=rid)
        return r

    runs = [once(), once()]
    cluster.stop("router")
    cluster.restart("router")
    runs.append(once())
    assert [(r.route, r.attempts, r.failed_attempts) for r in runs] == [("disaggregated", 1, "")] * 3
    assert runs[0].token_ids == runs[1].token_ids == runs[2].token_ids
    assert_cluster_clean(cluster)
