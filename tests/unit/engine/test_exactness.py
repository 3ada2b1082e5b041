"""Exactness inside the engine: batching, chunking and prefix reuse change no bit."""

from __future__ import annotations

import random

import pytest

from runtime.engine import SamplingParams
from tests.support.engine import assert_no_leak, random_prompt, tiny_engine

GREEDY = SamplingParams(ignore_eos=True)


def test_batched_paged_decode_equals_one_at_a_time():
    rng = random.Random(1)
    prompts = [random_prompt(rng, n) for n in (5, 16, 17, 40, 100, 3, 64, 250)]
    engine = tiny_engine(num_blocks=256)
    solo = [engine.generate(p, 24, GREEDY) for p in prompts]

    seqs = [engine.add_request(f"r{i}", p, 24, GREEDY, reuse_prefix=False)
            for i, p in enumerate(prompts)]
    for s in seqs:
        engine.prefill(s)
    while any(not s.is_finished for s in seqs):
        engine.decode_step([s for s in seqs if not s.is_finished])
    assert [s.output_ids for s in seqs] == solo
    for s in seqs:
        engine.free(s)
    assert_no_leak(engine)


def test_sampled_decode_is_seeded_and_batch_independent():
    rng = random.Random(2)
    prompts = [random_prompt(rng, n) for n in (9, 33, 70)]
    params = [SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=s, ignore_eos=True)
              for s in (11, 12, 13)]
    engine = tiny_engine()
    solo = [engine.generate(p, 16, sp) for p, sp in zip(prompts, params)]
    assert solo[0] != engine.generate(prompts[0], 16, params[1])  # the seed matters
    seqs = [engine.add_request(f"r{i}", p, 16, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
    for s in seqs:
        engine.prefill(s)
    while any(not s.is_finished for s in seqs):
        engine.decode_step([s for s in seqs if not s.is_finished])
    assert [s.output_ids for s in seqs] == solo
    for s in seqs:
        engine.free(s)
    assert_no_leak(engine)


@pytest.mark.parametrize("chunk", [1, 7, 16, 50, 128])
def test_chunked_prefill_kv_bytes_equal_one_shot(chunk):
    prompt = random_prompt(random.Random(3), 203)
    engine = tiny_engine(chunk_tokens=4096)
    one = engine.add_request("one", prompt, 4, GREEDY, reuse_prefix=False)
    first_one = engine.prefill(one)
    chunked_engine = tiny_engine(chunk_tokens=chunk)
    two = chunked_engine.add_request("two", prompt, 4, GREEDY)
    first_two = chunked_engine.prefill(two)
    assert first_one == first_two
    assert engine.kv_digest(one) == chunked_engine.kv_digest(two)
    engine.free(one)
    chunked_engine.free(two)
    assert_no_leak(engine)
    assert_no_leak(chunked_engine)


def test_prefix_reuse_computes_only_the_rest_and_matches_one_shot():
    rng = random.Random(4)
    shared = random_prompt(rng, 96)  # 6 full blocks
    a_prompt, b_prompt = shared + random_prompt(rng, 21), shared + random_prompt(rng, 40)
    engine = tiny_engine(chunk_tokens=32)
    a = engine.add_request("a", a_prompt, 3, GREEDY)
    engine.prefill(a)
    engine.free(a)
    written = []
    b = engine.add_request("b", b_prompt, 3, GREEDY)
    assert b.num_cached_tokens == 96
    engine.prefill(b, on_layer=lambda layer, start, end: written.append((layer, start, end)))
    assert min(start for _, start, _ in written) == 96  # the compute set starts after the hit

    fresh = tiny_engine(chunk_tokens=4096)
    ref = fresh.add_request("ref", b_prompt, 3, GREEDY)
    fresh.prefill(ref)
    assert engine.kv_digest(b) == fresh.kv_digest(ref)
    assert b.output_ids == ref.output_ids
    for e, s in ((engine, b), (fresh, ref)):
        e.free(s)
        assert_no_leak(e)


def test_full_prompt_hit_still_computes_last_token():
    prompt = random_prompt(random.Random(5), 64)  # exactly 4 blocks
    engine = tiny_engine()
    first = engine.generate(prompt, 1, GREEDY)
    seq = engine.add_request("again", prompt, 1, GREEDY)
    assert seq.num_cached_tokens == 48  # the block holding the last token is recomputed
    assert [engine.prefill(seq)] == first
    engine.free(seq)
    assert_no_leak(engine)


def test_on_layer_reports_every_layer_of_every_chunk_in_order():
    engine = tiny_engine(chunk_tokens=40)
    events = []
    seq = engine.add_request("r", random_prompt(random.Random(6), 100), 2, GREEDY)
    engine.prefill(seq, on_layer=lambda *e: events.append(e))
    layers = engine.model_cfg.num_hidden_layers
    chunks = [(0, 40), (40, 80), (80, 100)]
    assert events == [(layer, s, e) for s, e in chunks for layer in range(layers)]
    engine.free(seq)
    assert_no_leak(engine)
