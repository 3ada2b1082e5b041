"""Log-probabilities (SamplingParams.logprobs): the model's raw log-softmax at each sampled
position, equal to transformers' within 1e-4, and exact like the tokens: the same bits in
a batch or alone, chunked or one-shot, after a hand-off or a resume (docs/design.md,
Principles; runtime/engine/sampler.py)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from runtime.engine import Engine, EngineConfig, SamplingParams
from runtime.engine.sampler import TokenLogprobs, log_softmax, token_logprobs
from tests.support.engine import GQA, assert_no_leak, random_prompt, tiny_engine, write_checkpoint
from tests.support.handoff_harness import hand_off

SAMPLED = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=5, ignore_eos=True, logprobs=5)
GREEDY = SamplingParams(ignore_eos=True, logprobs=3)


def run(engine: Engine, prompt: list[int], max_tokens: int, params: SamplingParams) -> tuple[list, list]:
    """(tokens, logprobs) of one request alone, freed after."""
    seq = engine.add_request("r", prompt, max_tokens, params)
    engine.prefill(seq)
    while not seq.is_finished:
        engine.decode_step([seq])
    engine.free(seq)
    return list(seq.output_ids), list(seq.output_logprobs)


def test_log_softmax_is_torchs_within_rounding():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 8
    assert torch.allclose(torch.from_numpy(log_softmax(logits)), torch.log_softmax(logits, -1), atol=2e-6)


def test_top_tokens_are_the_most_likely_ties_by_lower_id():
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, 0.5, 3.0, 2.0])
    lp = token_logprobs(logits, 4, 4)
    assert [i for i, _ in lp.top] == [1, 3, 5, 2]  # three tied at 3.0 in id order, then the lower of two 2.0s
    assert lp.logprob == pytest.approx(lp.top[0][1] - 2.5, abs=1e-6) and lp.top[0][1] == lp.top[1][1] == lp.top[2][1]
    assert token_logprobs(logits, 4, 0) == TokenLogprobs(lp.logprob, ())
    assert len(token_logprobs(logits, 0, 20).top) == 7  # k past the vocabulary: all of it


def test_nothing_is_kept_unless_asked_and_the_limit_holds():
    engine = tiny_engine()
    seq = engine.add_request("r", [1, 2, 3], 3, SamplingParams(ignore_eos=True))
    engine.prefill(seq)
    engine.decode_step([seq])
    assert seq.output_logprobs == [] and seq.logprobs_of(0) is None
    engine.free(seq)
    with pytest.raises(ValueError, match=r"logprobs 21 not in \[0, 20\]"):
        SamplingParams(logprobs=21)
    _, zero = run(engine, [4, 5, 6], 3, SamplingParams(ignore_eos=True, logprobs=0))
    assert len(zero) == 3 and all(lp.top == () and lp.logprob <= 0 for lp in zero)
    assert_no_leak(engine)


def test_batched_and_chunked_logprobs_are_the_solo_bits():
    rng = random.Random(3)
    prompts = [random_prompt(rng, n) for n in (9, 40, 130)]
    params = [SAMPLED, GREEDY, dataclasses.replace(SAMPLED, seed=9, logprobs=20)]
    solo = [run(tiny_engine(), p, 12, sp) for p, sp in zip(prompts, params)]
    engine = tiny_engine(chunk_tokens=16)
    seqs = [engine.add_request(f"r{i}", p, 12, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
    for s in seqs:
        engine.prefill(s)
    while any(not s.is_finished for s in seqs):
        engine.decode_step([s for s in seqs if not s.is_finished])
    assert [(s.output_ids, s.output_logprobs) for s in seqs] == [(t, lp) for t, lp in solo]
    for s in seqs:
        engine.free(s)
    assert_no_leak(engine)


def test_a_hand_off_and_a_resume_give_the_colocated_bits():
    prompt = random_prompt(random.Random(4), 90)
    tokens, logprobs = run(tiny_engine(), prompt, 12, SAMPLED)
    p, d = tiny_engine(chunk_tokens=32), tiny_engine()
    done = hand_off(p, d, prompt, 12, SAMPLED)
    assert done.tokens == tokens
    assert done.first_logprobs == logprobs[0] and done.logprobs[0] is None  # D imported token 0, P sampled it
    assert done.logprobs[1:] == logprobs[1:]
    k = 5
    resumed = run(tiny_engine(chunk_tokens=24), prompt + tokens[:k], 12 - k, dataclasses.replace(SAMPLED, first_step=k))
    assert resumed == (tokens[k:], logprobs[k:])
    for e in (p, d):
        assert_no_leak(e)


def test_logprobs_are_transformers_raw_log_softmax(tmp_path):
    """Sampled with temperature, top-k and top-p: the values are the raw model's, not the
    distribution sampled (vLLM's default)."""
    transformers = pytest.importorskip("transformers")
    path = write_checkpoint(GQA, tmp_path / "gqa", seed=3)
    engine = Engine.from_checkpoint(path, EngineConfig(num_blocks=64, chunk_tokens=64, attn_tile_tokens=64))
    prompt = random_prompt(random.Random(7), 100, GQA.vocab_size)
    tokens, logprobs = run(engine, prompt, 16, SAMPLED)
    model = transformers.LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    with torch.no_grad():
        ref = torch.log_softmax(model(input_ids=torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:], -1)
    for step, (token, lp) in enumerate(zip(tokens, logprobs)):
        assert abs(lp.logprob - float(ref[step, token])) <= 1e-4, step
        top = torch.topk(ref[step], 5)
        assert [i for i, _ in lp.top] == top.indices.tolist(), step
        assert max(abs(v - float(r)) for (_, v), r in zip(lp.top, top.values)) <= 1e-4, step
