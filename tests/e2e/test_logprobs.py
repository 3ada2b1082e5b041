"""Log-probabilities on the local cluster, through the router to the SDK (SamplingParams.logprobs):
a request's are, bit for bit, the same split (token 0 the prefill's, the rest the decode's
after the K/V hand-off, the prefill computing the prompt in other chunks than the decode
worker does) as colocated, three split at once (one decode batch) as alone, and the
engine's own in this process (docs/design.md, Principles: exactness; the engine's values
against transformers: tests/unit/engine/test_logprobs.py)."""

from __future__ import annotations

import dataclasses
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from pdserve_client import GenerateOptions
from runtime.engine import Engine, EngineConfig, SamplingParams
from tests.support.cluster import assert_cluster_clean, client, start_cluster

PROMPT = [random.Random(31).randrange(3, 500) for _ in range(150)]
MAX_TOKENS = 8
OPTIONS = {"greedy": GenerateOptions(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5),
           "sampled": GenerateOptions(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=20, temperature=0.9,
                                      top_k=50, top_p=0.95, seed=7)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("logprobs"), prefill=1, decode=1,
                      worker_env={"prefill-0": {"PD_CHUNK_TOKENS": "48"}})  # the decode's: 256, one chunk
    yield c
    c.down()


def generate(cluster, options: GenerateOptions, mode: str) -> tuple[str, list[tuple[int, float, tuple]]]:
    """(route, each token's (id, logprob, top)) of one request."""
    with client(cluster) as sdk:
        stream = sdk.generate(prompt_ids=PROMPT, options=dataclasses.replace(options, mode=mode))
        tokens = [(e.token_id, e.logprobs.logprob, e.logprobs.top) for e in stream]
    return stream.result.route, tokens


def in_process(o: GenerateOptions) -> list[tuple[int, float, tuple]]:
    """The same request on an engine of the cluster's model in this process."""
    engine = Engine.from_preset("tiny", cfg=EngineConfig(num_blocks=64))
    seq = engine.add_request("r", PROMPT, MAX_TOKENS, SamplingParams(
        temperature=o.temperature, top_k=o.top_k, top_p=o.top_p, seed=o.seed or 0, ignore_eos=True,
        logprobs=o.logprobs))
    engine.prefill(seq)
    while not seq.is_finished:
        engine.decode_step([seq])
    engine.free(seq)
    return [(t, lp.logprob, lp.top) for t, lp in zip(seq.output_ids, seq.output_logprobs)]


@pytest.mark.parametrize("name", list(OPTIONS))
def test_split_logprobs_are_the_colocated_bits(cluster, name):
    options = OPTIONS[name]
    route, colocated = generate(cluster, options, "colocated")
    with ThreadPoolExecutor(3) as pool:
        splits = list(pool.map(lambda _: generate(cluster, options, "disaggregated"), range(3)))
    assert route == "colocated" and [r for r, _ in splits] == ["disaggregated"] * 3
    assert len(colocated) == MAX_TOKENS and all(len(top) == options.logprobs for *_, top in colocated)
    assert all(tokens == colocated for _, tokens in splits)  # ids and float32 values, bit for bit
    assert in_process(options) == colocated
    assert_cluster_clean(cluster)
