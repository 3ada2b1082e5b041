"""Token sampling: greedy, or temperature / top-k / top-p with a seeded generator.

Randomness is a pure function of (seed, step): step i of a request draws from a
generator seeded with mix(seed, i). So any worker can take over a request at any
step — prefill samples token 0, decode continues at token 1 — and draw exactly
what a single worker would have drawn. The probabilities are the same bits on
every worker too: the softmax runs the engine's exact exp and in-order sum
(ops.py), not torch's, whose bits follow the CPU's vector width; sorts are stable.
The draw itself is ours, not torch.multinomial's (an exponential race over ATen's
transform of its generator and the C library's log, whose code glibc picks by CPU, FMA
or not): one uniform from the step's seed, looked up in the in-order float64 running
sum of the probabilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .ops import exp_, row_sum


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token."""

    temperature: float = 0.0
    """0 means greedy (argmax, first index on ties)."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 keeps all."""
    top_p: float = 1.0
    """Keep the smallest set whose probability reaches top_p."""
    seed: int = 0
    """Seed of the per-request generator."""
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    """Finish when one of these is generated (in addition to the model's EOS)."""
    ignore_eos: bool = False
    """Do not stop at the model's EOS ids (benchmarks)."""
    first_step: int = 0
    """Output index of the first token this request samples. A resumed request (its
    stream moved to another worker after k tokens) sends its prompt followed by those k
    tokens with first_step k: the last k prompt tokens are outputs replayed (their K/V
    is computed as decode computed it, runtime/engine/engine.py), and the draws go on
    at step k, so the rest is the bits an uninterrupted run gives."""

    def __post_init__(self):
        if self.first_step < 0:
            raise ValueError(f"first_step {self.first_step} < 0")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature {self.temperature} is not a finite number >= 0")
        if self.top_k < 0:
            raise ValueError(f"top_k {self.top_k} < 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p {self.top_p} not in (0, 1]")

    @property
    def greedy(self) -> bool:
        """True when sampling is argmax."""
        return self.temperature == 0.0


_MASK64 = 0xFFFF_FFFF_FFFF_FFFF


def _step_seed(seed: int, step: int) -> int:
    return (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9) & 0x7FFF_FFFF_FFFF_FFFF


def uniform(seed: int, step: int) -> float:
    """The draw of output position `step`: a float64 in [0, 1), its top 53 bits from
    SplitMix64's output function over the step's seed (integer arithmetic only)."""
    z = (_step_seed(seed, step) + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 11) * 2.0 ** -53


def pick(probs: torch.Tensor, u: float) -> int:
    """The token whose slice of the float64 running sum of `probs` (float32 [V], >= 0, not
    all 0) holds u * total: the first index whose running sum exceeds it, so a token of
    probability 0 is never picked. numpy's cumsum adds in index order, each add
    correctly rounded: the same bits on every CPU."""
    p = probs.numpy()
    running = np.cumsum(p, dtype=np.float64)
    i = int(np.searchsorted(running, u * running[-1], side="right"))
    if i == len(running):  # u * total rounded up to the total: the last token with mass
        i = int(np.flatnonzero(p)[-1])
    return i


def sample_one(logits: torch.Tensor, params: SamplingParams, step: int) -> int:
    """Pick a token from float32 logits [V] for output position `step`."""
    if params.greedy:
        return int(torch.argmax(logits))
    x = logits / params.temperature
    if params.top_k and params.top_k < x.numel():
        # Exactly k survivors, ties broken toward the lower index (as greedy argmax is).
        keep = torch.sort(x, descending=True, stable=True).indices[:params.top_k]
        x = torch.full_like(x, float("-inf")).scatter(0, keep, x[keep])
    probs = softmax(x)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True, stable=True)
        # Drop a token when the mass before it already reaches top_p.
        drop = (torch.cumsum(sorted_p, 0) - sorted_p) >= params.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return pick(probs, uniform(params.seed, step))


def softmax(x: torch.Tensor) -> torch.Tensor:
    """softmax of float32 x [V] by the exact kernels (exp(-inf) = 0 exactly)."""
    e = exp_(x - x.max())
    return e / row_sum(e[None])[0]


def sample(logits: torch.Tensor, params: list[SamplingParams], steps: list[int]) -> list[int]:
    """One token per row of logits [B, V]."""
    if all(p.greedy for p in params):
        return torch.argmax(logits, dim=-1).tolist()
    return [sample_one(logits[i], p, s) for i, (p, s) in enumerate(zip(params, steps))]
