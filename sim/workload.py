"""What the simulated clients send: requests with an arrival time, a prompt length and
an output length (the columns of the Azure LLM inference traces), replayed open loop.

    Workload.from_csv(path)            a trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)
    Workload.from_lengths(rate, ...)   Poisson arrivals at `rate`, lengths drawn from samples
    Workload.synthetic(rate, n, ...)   seeded lognormal lengths (no trace at hand)
    w.scaled(rate) / w.head(n) / w.window(...)   the same requests at another rate, fewer of them
    interleave(a, b)                   two workloads merged by arrival time (per-request choice)

A request may share a leading prefix with others (`prefix_group`, `prefix_tokens`: a
system prompt, a conversation's earlier turns): the workers' prefix caches and the
router's prefix index then see the same leading blocks. The traces carry no content, so
their requests share nothing.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import heapq
import math
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

TRACE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""The Azure traces' header (../shared/traces in the project's workspace); a CSV for
`pdctl plan --trace` must have these columns."""


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One request of a workload."""

    arrival_s: float
    """Seconds after the workload's start."""
    prompt_tokens: int
    output_tokens: int
    """Tokens generated (the replay forces this many: ignore-EOS)."""
    prefix_group: int = -1
    """Requests of one group >= 0 share their first `prefix_tokens` tokens."""
    prefix_tokens: int = 0
    kind: str = ""
    """Which source it came from (interleaved workloads: the trace's name)."""

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"a request needs >= 1 prompt and output token, got {self.prompt_tokens}, "
                             f"{self.output_tokens}")
        if not (math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise ValueError(f"arrival_s must be finite and >= 0, got {self.arrival_s!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    """Requests in arrival order."""

    requests: tuple[Request, ...]
    name: str = ""

    def __post_init__(self) -> None:
        if any(b.arrival_s < a.arrival_s for a, b in zip(self.requests, self.requests[1:])):
            raise ValueError("requests must be in arrival order")

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def duration_s(self) -> float:
        """First to last arrival."""
        return self.requests[-1].arrival_s - self.requests[0].arrival_s if self.requests else 0.0

    @property
    def rate_rps(self) -> float:
        """Mean arrival rate: (n - 1) gaps over the span (0 with fewer than two requests)."""
        return (len(self) - 1) / self.duration_s if len(self) > 1 and self.duration_s > 0 else 0.0

    # ---- sources -------------------------------------------------------------------
    @classmethod
    def from_csv(cls, path: str | Path, name: str = "") -> Workload:
        """A trace with the Azure traces' columns; arrivals relative to its first row."""
        path = Path(path)
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; a trace needs "
                                 f"{', '.join(TRACE_COLUMNS)}")
            rows = [(_timestamp(r["TIMESTAMP"], path, i), _count(r, "ContextTokens", path, i),
                     _count(r, "GeneratedTokens", path, i)) for i, r in enumerate(reader, start=2)]
        if not rows:
            raise ValueError(f"{path}: no requests")
        rows.sort(key=lambda r: r[0])
        t0 = rows[0][0]
        kind = name or path.stem
        return cls(tuple(Request(t - t0, p, o, kind=kind) for t, p, o in rows), kind)

    @classmethod
    def from_lengths(cls, rate_rps: float, prompt_tokens: Sequence[int], output_tokens: Sequence[int],
                     n: int | None = None, seed: int = 0, name: str = "lengths") -> Workload:
        """Poisson arrivals at `rate_rps`; each request's (prompt, output) drawn from the paired
        samples (`n`: how many, default one per sample)."""
        if rate_rps <= 0 or not prompt_tokens or len(prompt_tokens) != len(output_tokens):
            raise ValueError("from_lengths needs a rate > 0 and equally long, non-empty samples")
        rng = np.random.default_rng(seed)
        n = len(prompt_tokens) if n is None else n
        picks = rng.integers(0, len(prompt_tokens), n)
        arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, n)) - 0.0
        arrivals -= arrivals[0]
        return cls(tuple(Request(float(t), max(1, int(prompt_tokens[i])), max(1, int(output_tokens[i])), kind=name)
                         for t, i in zip(arrivals, picks)), name)

    @classmethod
    def synthetic(cls, rate_rps: float, n: int, prompt_median: int = 1024, output_median: int = 128,
                  sigma: float = 1.0, seed: int = 0, name: str = "synthetic") -> Workload:
        """Poisson arrivals, lognormal lengths around the medians (seeded)."""
        rng = np.random.default_rng(seed)
        p = np.clip(rng.lognormal(math.log(prompt_median), sigma, n), 1, 32768).astype(int)
        o = np.clip(rng.lognormal(math.log(output_median), sigma, n), 1, 4096).astype(int)
        return cls.from_lengths(rate_rps, p.tolist(), o.tolist(), n=n, seed=seed + 1, name=name)

    # ---- reshaping -------------------------------------------------------------------
    def scaled(self, rate_rps: float) -> Workload:
        """The same requests, arrival gaps scaled so the mean rate is `rate_rps`."""
        if rate_rps <= 0:
            raise ValueError(f"rate must be > 0, got {rate_rps!r}")
        k = self.rate_rps / rate_rps if self.rate_rps > 0 else 1.0
        t0 = self.requests[0].arrival_s if self.requests else 0.0
        return Workload(tuple(dataclasses.replace(r, arrival_s=(r.arrival_s - t0) * k) for r in self.requests),
                        self.name)

    def spanning(self, seconds: float, max_copies: int = 32) -> Workload:
        """The requests again and again (each copy after the last, one mean gap apart) until
        the arrivals span at least `seconds`, at most `max_copies` copies: a short sample at a
        high rate is one burst, and a cluster's steady state needs arrivals for longer than
        its requests last."""
        if len(self) < 2 or self.duration_s >= seconds:
            return self
        gap = self.duration_s / (len(self) - 1)
        period = self.duration_s + gap
        copies = min(max_copies, int(seconds // period) + 1)
        t0 = self.requests[0].arrival_s
        out = [dataclasses.replace(r, arrival_s=r.arrival_s - t0 + k * period) for k in range(copies)
               for r in self.requests]
        return Workload(tuple(out), self.name)

    def head(self, n: int) -> Workload:
        """The first `n` requests."""
        return Workload(self.requests[:n], self.name)

    def window(self, start: int, n: int) -> Workload:
        """`n` requests from index `start`, arrivals relative to the first of them."""
        part = self.requests[start:start + n]
        t0 = part[0].arrival_s if part else 0.0
        return Workload(tuple(dataclasses.replace(r, arrival_s=r.arrival_s - t0) for r in part), self.name)

    def capped(self, max_model_len: int) -> Workload:
        """Requests whose prompt + output fit `max_model_len` (0: all); the rest are dropped."""
        if max_model_len <= 0:
            return self
        return Workload(tuple(r for r in self.requests if r.prompt_tokens + r.output_tokens <= max_model_len),
                        self.name)

    def with_prefixes(self, groups: int, prefix_tokens: int, share: float, seed: int = 0) -> Workload:
        """A `share` of the requests get one of `groups` shared prefixes of `prefix_tokens`
        (at most their prompt less one token), seeded."""
        rng = random.Random(seed)
        out = []
        for r in self.requests:
            if rng.random() < share and r.prompt_tokens > 1:
                r = dataclasses.replace(r, prefix_group=rng.randrange(groups),
                                        prefix_tokens=min(prefix_tokens, r.prompt_tokens - 1))
            out.append(r)
        return Workload(tuple(out), self.name)

    def lengths(self) -> tuple[list[int], list[int]]:
        """(prompt lengths, output lengths), in arrival order."""
        return [r.prompt_tokens for r in self.requests], [r.output_tokens for r in self.requests]


def interleave(workloads: Iterable[Workload], name: str = "") -> Workload:
    """The workloads' requests merged by arrival time (each keeps its `kind`)."""
    ws = list(workloads)
    merged = heapq.merge(*(w.requests for w in ws), key=lambda r: r.arrival_s)
    return Workload(tuple(merged), name or "+".join(w.name for w in ws))


def _timestamp(text: str, path: Path, line: int) -> float:
    """Seconds since the epoch of an Azure trace timestamp ('2023-11-16 18:15:46.6805900';
    more than six fractional digits are cut to microseconds) or of a plain number of seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    head, _, frac = text.partition(".")
    try:
        t = datetime.datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.UTC)
    except ValueError as e:
        raise ValueError(f"{path}:{line}: TIMESTAMP {text!r} is neither seconds nor 'YYYY-MM-DD HH:MM:SS[.f]'") \
            from e
    return t.timestamp() + (float("0." + frac) if frac.isdigit() else 0.0)


def _count(row: dict, column: str, path: Path, line: int) -> int:
    try:
        v = int(row[column])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}:{line}: {column} {row[column]!r} is not an integer") from e
    if v < 1:
        raise ValueError(f"{path}:{line}: {column} must be >= 1, got {v}")
    return v
