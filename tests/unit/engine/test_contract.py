"""The built-in engine keeps the hand-off's engine contract (runtime/worker/engine_contract.py):
a whole hand-off driven through the contract's calls alone, between two engines, gives the
tokens a colocated run gives, both ends' digests equal, and every block back; and the
contract's failure semantics hold (a refused request holds nothing; free is idempotent)."""

from __future__ import annotations

import random

import pytest

from runtime.engine import InvalidRequest, OutOfBlocks, SamplingParams
from runtime.worker.engine_contract import HandOffEngine
from tests.support.engine import assert_no_leak, random_prompt, tiny_engine

SAMPLING = SamplingParams(temperature=0.8, top_p=0.9, seed=11, ignore_eos=True)


def hand_off(p: HandOffEngine, d: HandOffEngine, prompt: list[int], max_tokens: int) -> tuple[list[int], str, str]:
    """P computes the prompt, D reserves, the K/V moves through both ends' views, D admits
    and decodes: (tokens, P's digest, D's digest)."""
    layers_final = set()
    src = p.add_request("r", prompt, 1, SAMPLING)
    dst = d.add_request("r", prompt, max_tokens, SAMPLING)
    token = None
    while token is None:
        token = p.prefill_chunk(src, on_layer=lambda layer, start, end: layers_final.add(layer)
                                if end >= len(prompt) else None)
    first, blocks = dst.num_cached_tokens // d.block_size, -(-len(prompt) // d.block_size)
    for layer in sorted(layers_final):  # a layer's views are read once it is final
        for (sk, sv), (dk, dv) in zip(p.kv_views(src, layer, first, blocks - first),
                                      d.kv_views(dst, layer, first, blocks - first)):
            dk[:], dv[:] = sk, sv
    digests = p.kv_digest(src), d.kv_digest(dst)
    p.free(src)
    d.commit_import(dst, token)
    while not dst.is_finished:
        d.decode_step([dst])
    tokens = list(dst.output_ids)
    d.free(dst)
    d.free(dst)  # idempotent
    return tokens, *digests


def test_the_built_in_engine_keeps_the_contract():
    p, d, alone = tiny_engine(chunk_tokens=32), tiny_engine(), tiny_engine()
    assert isinstance(p, HandOffEngine)
    prompt = random_prompt(random.Random(4), 90)
    tokens, p_digest, d_digest = hand_off(p, d, prompt, 12)
    assert tokens == alone.generate(prompt, 12, SAMPLING)
    assert p_digest == d_digest
    for e in (p, d, alone):
        assert_no_leak(e)


def test_a_refused_request_holds_nothing():
    e = tiny_engine(num_blocks=8)
    before = e.num_free_blocks
    with pytest.raises(OutOfBlocks):
        e.add_request("big", random_prompt(random.Random(1), 200), 10)
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        e.add_request("bad", [1, 10**9], 4)
    assert e.num_free_blocks == before
    assert_no_leak(e)
