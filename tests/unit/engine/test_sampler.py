"""Sampler: greedy tie-breaking, top-k / top-p sets, and (seed, step) determinism."""

from __future__ import annotations

import collections
import math

import pytest
import torch

from runtime.engine.sampler import SamplingParams, pick, sample, sample_one, uniform


def _logits(seed: int, v: int = 100, scale: float = 3.0) -> torch.Tensor:
    """Continuous random float32 logits [v] (no ties)."""
    return torch.randn(v, generator=torch.Generator().manual_seed(seed)) * scale


def _log_probs(*p: float) -> torch.Tensor:
    return torch.tensor([math.log(x) for x in p], dtype=torch.float32)


@pytest.mark.parametrize("v,ties", [(16, (3, 7)), (32000, (100, 20000, 31999))])
def test_greedy_picks_the_first_index_on_ties(v, ties):
    logits = torch.zeros(v)
    logits[list(ties)] = 5.0
    assert sample_one(logits, SamplingParams(), step=0) == ties[0]
    # Batched greedy path (all rows greedy): the same rule per row.
    batch = torch.stack([logits, logits.flip(0)])
    assert sample(batch, [SamplingParams()] * 2, [0, 0]) == [ties[0], v - 1 - ties[-1]]


def test_mixed_batch_rows_follow_their_own_params():
    logits = torch.stack([_logits(1), _logits(2)])
    hot = SamplingParams(temperature=1.0, seed=9)
    got = sample(logits, [SamplingParams(), hot], [0, 4])
    assert got == [int(logits[0].argmax()), sample_one(logits[1], hot, 4)]


@pytest.mark.parametrize("temperature", [0.3, 1.0, 5.0])
def test_top_k_1_equals_greedy(temperature):
    for i in range(50):
        logits = _logits(i)
        p = SamplingParams(temperature=temperature, top_k=1, seed=i)
        assert sample_one(logits, p, step=i) == int(logits.argmax())


@pytest.mark.parametrize("temperature", [0.5, 1.0, 5.0])
def test_tiny_top_p_equals_greedy(temperature):
    for i in range(50):
        logits = _logits(i, scale=0.5)  # flat: plenty of mass outside the top token
        p = SamplingParams(temperature=temperature, top_p=1e-6, seed=i)
        assert sample_one(logits, p, step=i) == int(logits.argmax())


def test_same_seed_and_step_give_the_same_token():
    logits = torch.zeros(64)  # uniform: the draw is all randomness
    for seed in range(20):
        p = SamplingParams(temperature=1.0, seed=seed)
        for step in (0, 1, 17):
            assert len({sample_one(logits, p, step) for _ in range(3)}) == 1
            # ... and the same in a batch, at any row.
            row = sample(torch.stack([_logits(seed, v=64), logits]), [p, p], [step + 1, step])[1]
            assert row == sample_one(logits, p, step)


def test_different_steps_and_seeds_draw_independently():
    logits = torch.zeros(16)  # uniform over 16: two independent draws agree 1/16 of the time
    n = 400
    by_step = [sample_one(logits, SamplingParams(temperature=1.0, seed=s), 0) for s in range(n)]
    by_step1 = [sample_one(logits, SamplingParams(temperature=1.0, seed=s), 1) for s in range(n)]
    same = sum(a == b for a, b in zip(by_step, by_step1)) / n
    assert same < 0.15, f"step 0 and step 1 agree on {same:.0%} of seeds"
    one_seed = [sample_one(logits, SamplingParams(temperature=1.0, seed=5), t) for t in range(n)]
    assert len(set(one_seed)) == 16
    assert max(collections.Counter(one_seed).values()) < n / 4


@pytest.mark.parametrize("temperature,expected", [
    (1.0, [0.5, 0.3, 0.2]),
    (0.5, [0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38]),  # p**2, renormalized
])
def test_draws_follow_the_tempered_distribution(temperature, expected):
    logits = _log_probs(0.5, 0.3, 0.2)
    n = 3000
    counts = collections.Counter(
        sample_one(logits, SamplingParams(temperature=temperature, seed=s), s % 7)
        for s in range(n))
    freq = [counts[i] / n for i in range(3)]
    assert all(abs(f - e) < 0.035 for f, e in zip(freq, expected)), (freq, expected)


def test_sampled_tokens_stay_in_the_top_k_set():
    logits = _logits(3, v=200, scale=1.0)
    top = set(torch.topk(logits, 5).indices.tolist())
    draws = [sample_one(logits, SamplingParams(temperature=3.0, top_k=5, seed=s), s)
             for s in range(500)]
    assert set(draws) == top  # inside the set, and not collapsed onto one token


def test_sampled_tokens_stay_in_the_top_p_nucleus():
    logits = _log_probs(0.1, 0.4, 0.2, 0.3)
    # Sorted 0.4, 0.3 | 0.2, 0.1: mass before 0.2 is 0.7 >= 0.6, so {1, 3} remain.
    draws = [sample_one(logits, SamplingParams(temperature=1.0, top_p=0.6, seed=s), 0)
             for s in range(1000)]
    counts = collections.Counter(draws)
    assert set(counts) == {1, 3}
    assert abs(counts[1] / 1000 - 0.4 / 0.7) < 0.05


def test_top_k_keeps_exactly_k_on_ties():
    from runtime.engine.sampler import sample_one

    logits = torch.zeros(16)
    logits[3] = logits[7] = 5.0
    seen = {sample_one(logits, SamplingParams(temperature=1.0, top_k=1, seed=s), 0)
            for s in range(40)}
    assert seen == {3}


# ---- the draw: ours, the same bits on every CPU ----------------------------------


def test_the_uniform_is_splitmix64s_output():
    """Seed 0, step 0 is SplitMix64's state 0, whose first output is the reference
    implementation's published 0xE220A8397B1DCDAF (its top 53 bits)."""
    assert uniform(0, 0) == (0xE220A8397B1DCDAF >> 11) * 2.0 ** -53
    draws = [uniform(seed, step) for seed in range(50) for step in range(50)]
    assert all(0.0 <= u < 1.0 for u in draws) and len(set(draws)) == len(draws)


def _reference_pick(probs: list[float], u: float) -> int:
    """The inverse CDF in plain Python floats (IEEE doubles): in-order running sum."""
    running, total = [], 0.0
    for p in probs:
        total += p
        running.append(total)
    target = u * total
    for i, r in enumerate(running):
        if r > target:
            return i
    return max(i for i, p in enumerate(probs) if p > 0)


def test_the_pick_is_the_in_order_inverse_cdf():
    g = torch.Generator().manual_seed(4)
    for trial in range(300):
        v = (7, 512, 4096)[trial % 3]
        probs = torch.rand(v, generator=g) ** 4
        probs[torch.rand(v, generator=g) < 0.3] = 0.0  # top-k / top-p leave zeros
        probs[v // 2] = 1e-3
        probs = probs / probs.sum()
        values = probs.tolist()
        for step in range(5):
            u = uniform(trial, step)
            assert pick(probs, u) == _reference_pick(values, u), (trial, step)


def test_the_pick_never_lands_on_a_token_without_mass():
    probs = torch.tensor([0.0, 0.25, 0.0, 0.0, 0.75, 0.0])
    assert pick(probs, 0.0) == 1
    assert pick(probs, 0.25) == 4  # the boundary belongs to the next token with mass
    assert pick(probs, 1.0 - 2.0 ** -53) == 4
    seen = {pick(probs, uniform(s, 0)) for s in range(200)}
    assert seen == {1, 4}
    # u * total rounded up to the total still names the last token with mass.
    assert pick(torch.tensor([0.3, 0.7, 0.0]), 1.0) == 1
