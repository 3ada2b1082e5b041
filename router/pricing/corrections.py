"""Online correction factors: the primitives router/pricing/cost_model.py keeps per worker,
per path and per route.

A factor is observed / predicted, clamped to [1/CLAMP, CLAMP] (`ratio`), and
followed by an EWMA (`Ewma.update`), or by a low-expectile step where samples
above the current value are mostly unmodelled queueing (`Ewma.update_low`:
down at full weight, up at OVERHEAD_UP_WEIGHT of it and capped at
OVERHEAD_UP_CAP x the current value). `Sized` keeps one factor per log2 size
bucket (tokens or bytes) plus one over all sizes: a factor learned from
2k-token prompts must not price a 90-token one.
"""

from __future__ import annotations

import dataclasses
import math

CLAMP = 20.0
"""Bound of a correction factor and of one observed/predicted ratio."""

SIZE_BUCKETS = 24
"""Size buckets of a sized correction: bucket = bit_length(size), capped (2^23 tokens or bytes and up share one)."""

OVERHEAD_UP_WEIGHT = 0.25
"""A TTFT residual above the learned overhead moves it at this fraction of the EWMA weight ..."""

OVERHEAD_UP_CAP = 4.0
"""... and counts at most this multiple of the current overhead (see the module docstring)."""


@dataclasses.dataclass(slots=True)
class Ewma:
    """An EWMA of a correction factor (its first sample sets it)."""

    value: float
    samples: int = 0

    def update(self, x: float, alpha: float) -> None:
        self.value = x if self.samples == 0 else (1 - alpha) * self.value + alpha * x
        self.samples += 1

    def update_low(self, x: float, alpha: float, floor: float) -> None:
        """Low-expectile step (see the module docstring): down at `alpha`, up at a
        quarter of it with the sample capped at OVERHEAD_UP_CAP x max(value, floor)."""
        if x > self.value:
            x = min(x, OVERHEAD_UP_CAP * max(self.value, floor))
            alpha *= OVERHEAD_UP_WEIGHT
        self.value += alpha * (x - self.value)
        self.samples += 1


def size_bucket(size: int) -> int:
    """Log2 bucket of a token or byte count."""
    return min(max(0, int(size)).bit_length(), SIZE_BUCKETS - 1)


@dataclasses.dataclass(slots=True)
class Sized:
    """A correction factor per size bucket, plus one over all sizes."""

    overall: Ewma = dataclasses.field(default_factory=lambda: Ewma(1.0))
    buckets: dict[int, Ewma] = dataclasses.field(default_factory=dict)

    def update(self, size: int, ratio: float, alpha: float) -> None:
        self.overall.update(ratio, alpha)
        self.buckets.setdefault(size_bucket(size), Ewma(1.0)).update(ratio, alpha)

    def factor(self, size: int) -> float:
        """The bucket's factor; else the nearest observed bucket's (the smaller on a tie); else 1."""
        if not self.buckets:
            return 1.0
        b = size_bucket(size)
        return self.buckets[min(self.buckets, key=lambda k: (abs(k - b), k))].value

    def scales(self) -> tuple[float, ...]:
        """factor(bucket) / overall factor for every bucket (WorkerCosts.pre_scale)."""
        if not self.buckets:
            return ()
        return tuple(self.factor((1 << b) >> 1) / self.overall.value for b in range(SIZE_BUCKETS))


def ratio(observed: float, predicted: float) -> float | None:
    """observed / predicted clamped to [1/CLAMP, CLAMP]; None when either is not a positive finite number."""
    if not (observed > 0 and predicted > 0 and math.isfinite(observed) and math.isfinite(predicted)):
        return None
    return min(CLAMP, max(1.0 / CLAMP, observed / predicted))
