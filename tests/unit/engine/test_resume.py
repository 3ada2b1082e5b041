"""A request resumed after k tokens: its prompt followed by the k tokens it already gave,
prefilled on a fresh engine, and its sampling's `first_step` at k, gives exactly the
tokens the uninterrupted run gave from k on (greedy and seeded sampling), and the K/V of
those k tokens as prefill computes them is, bit for bit, the K/V decode computed for them:
what lets the router move a request to another worker mid-stream without regenerating
the tokens its client already has (docs/design.md, Failures)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from runtime.engine import InvalidRequest, SamplingParams
from tests.support.engine import assert_no_leak, random_prompt, tiny_engine

MAX_TOKENS = 48
SAMPLINGS = {"greedy": SamplingParams(ignore_eos=True),
             "seeded": SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)}


@pytest.mark.parametrize("sampling", list(SAMPLINGS), ids=list(SAMPLINGS))
@pytest.mark.parametrize("k", [1, 2, 15, 16, 17, 47])
@pytest.mark.parametrize("chunk", [512, 24], ids=["whole", "chunked"])
def test_resuming_after_k_tokens_gives_the_rest_bit_for_bit(sampling, k, chunk):
    params = SAMPLINGS[sampling]
    prompt = random_prompt(random.Random(k), 37)
    whole_engine, resumed_engine = tiny_engine(), tiny_engine(chunk_tokens=chunk)
    seq = whole_engine.add_request("whole", prompt, MAX_TOKENS, params)
    whole_engine.prefill(seq)
    while not seq.is_finished:
        whole_engine.decode_step([seq])
    whole = list(seq.output_ids)
    decoded_kv = whole_engine.kv_digest(seq, len(prompt) + k)  # the prompt's and the first k outputs' K/V
    whole_engine.free(seq)

    again = resumed_engine.add_request("resumed", prompt + whole[:k], MAX_TOKENS - k,
                                       dataclasses.replace(params, first_step=k))
    first = resumed_engine.prefill(again)
    prefilled_kv = resumed_engine.kv_digest(again, len(prompt) + k)
    while not again.is_finished:
        resumed_engine.decode_step([again])
    rest = list(again.output_ids)
    resumed_engine.free(again)

    assert first == whole[k] and rest == whole[k:]
    assert prefilled_kv == decoded_kv
    assert_no_leak(whole_engine)
    assert_no_leak(resumed_engine)


def test_without_its_first_step_a_seeded_resume_draws_other_tokens():
    """The control: the draw follows the output index, so a resume that starts counting
    at 0 again gives other tokens (the test above would see it)."""
    params, k = SAMPLINGS["seeded"], 9
    prompt = random_prompt(random.Random(5), 37)
    e = tiny_engine()
    whole = e.generate(prompt, MAX_TOKENS, params)
    rest = e.generate(prompt + whole[:k], MAX_TOKENS - k, params)
    assert rest != whole[k:]
    assert_no_leak(e)


def test_replayed_outputs_never_enter_the_prefix_cache():
    """A replayed output's K/V is decode's bits: a later request whose prompt is the same
    tokens reuses only the prompt proper's blocks and computes the rest as prefill does,
    the same K/V as on an engine that never saw the resume."""
    prompt = random_prompt(random.Random(3), 40)
    e, fresh = tiny_engine(), tiny_engine()
    whole = e.generate(prompt, 30, SAMPLINGS["greedy"])
    resumed = e.add_request("resumed", prompt + whole[:25], 5, SamplingParams(ignore_eos=True, first_step=25))
    e.prefill(resumed)
    e.free(resumed)
    plain, alone = (engine.add_request("plain", prompt + whole[:25], 5, SAMPLINGS["greedy"]) for engine in (e, fresh))
    assert plain.num_cached_tokens == 32  # the prompt proper's two full blocks, nothing after them
    e.prefill(plain)
    fresh.prefill(alone)
    assert e.kv_digest(plain) == fresh.kv_digest(alone)
    for engine, seq in ((e, plain), (fresh, alone)):
        engine.free(seq)
        assert_no_leak(engine)


def test_a_negative_first_step_is_refused():
    with pytest.raises(ValueError, match="first_step"):
        SamplingParams(first_step=-1)


def test_a_first_step_that_replays_the_whole_prompt_is_refused():
    e = tiny_engine()
    with pytest.raises(InvalidRequest, match="first_step 4 replays the whole prompt of 4 tokens"):
        e.add_request("all", [5, 6, 7, 8], 3, SamplingParams(first_step=4))
    assert_no_leak(e)
