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
from tests.support.handoff_harness import hand_off

SAMPLING = SamplingParams(temperature=0.8, top_p=0.9, seed=11, ignore_eos=True)


def test_the_built_in_engine_keeps_the_contract():
    p, d, alone = tiny_engine(chunk_tokens=32), tiny_engine(), tiny_engine()
    assert isinstance(p, HandOffEngine)
    prompt = random_prompt(random.Random(4), 90)
    done = hand_off(p, d, prompt, 12, SAMPLING)
    assert done.tokens == alone.generate(prompt, 12, SAMPLING)
    assert done.p_digest == done.d_digest and done.layers_final
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
