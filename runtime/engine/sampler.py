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

Log-probabilities (`SamplingParams.logprobs`) are the model's own: the log-softmax of
the raw logits, before temperature, top-k and top-p (vLLM's default, `raw_logprobs`),
so a token's are the same whatever the request's sampling. They are computed per row
from the row's logits, which are batch-invariant (ops.py), by the same exact exp and
in-order sum as the softmax, and a software log: the same bits in any batch, chunking
or hand-off, on every CPU.
"""

from __future__ import annotations

import decimal
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from pdserve_client.contract import MAX_LOGPROBS

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
    logprobs: int | None = None
    """Log-probabilities with each sampled token (`TokenLogprobs`): None, none; 0, the
    chosen token's only; k, also the k most likely tokens (at most MAX_LOGPROBS)."""

    def __post_init__(self):
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs {self.logprobs} not in [0, {MAX_LOGPROBS}]")
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


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One sampled token's log-probabilities (float32 values, held as Python floats)."""

    logprob: float
    """The chosen token's."""
    top: tuple[tuple[int, float], ...] = ()
    """(token id, log-probability) of the k most likely tokens, most likely first, ties
    by lower id (k: SamplingParams.logprobs)."""


_LN = decimal.Context(prec=34)
"""The log of a row's sum in software, correctly rounded: the C library's log is picked
by CPU (FMA or not), and its last bit with it."""


def log_softmax(logits: torch.Tensor) -> np.ndarray:
    """float32 logits [V] -> float32 log-probabilities [V]: (x - max) - log(sum(exp(x - max))),
    the exp and the sum the exact kernels' (as `softmax`), the log `_LN`'s in float64, the
    difference taken in float64 and rounded once."""
    shifted = logits - logits.max()  # [V] float32, a new contiguous tensor
    total = float(row_sum(exp_(shifted.clone())[None])[0])
    log_total = float(_LN.ln(decimal.Decimal(total)))
    return (shifted.numpy().astype(np.float64) - log_total).astype(np.float32)


def token_logprobs(logits: torch.Tensor, token: int, k: int) -> TokenLogprobs:
    """`token`'s log-probability under float32 logits [V] and the k most likely tokens'
    (ties by lower id: the k-th largest value found by partition, the tokens at or
    above it ordered by value, then id)."""
    lp = log_softmax(logits)
    top: tuple[tuple[int, float], ...] = ()
    if k:
        k = min(k, lp.size)
        floor = np.partition(lp, lp.size - k)[lp.size - k]
        ids = np.flatnonzero(lp >= floor)
        ranked = ids[np.lexsort((ids, -lp[ids]))][:k]
        top = tuple((int(i), float(lp[i])) for i in ranked)
    return TokenLogprobs(float(lp[token]), top)


def logprobs_of(logits: torch.Tensor, tokens: list[int], params: list[SamplingParams]) -> list[TokenLogprobs | None]:
    """Each row's `token_logprobs` for the token sampled from it, where its request asked
    (None elsewhere: nothing is computed for it).  logits: [B, V] float32."""
    return [None if p.logprobs is None else token_logprobs(logits[i], t, p.logprobs)
            for i, (t, p) in enumerate(zip(tokens, params))]
