"""Goodput benchmark workloads: seeded request lists and arrival times.

A workload is a mix of request classes (`long`, `short`) and an arrival
process. `trace(workload, n, seed)` draws n requests and their arrival times
at unit rate (1 request/s on average); a rate point scales the times by
1/rate, so every rate of every mode replays the same requests in the same
order with the same gaps and lengths, only compressed. Prompt contents are
uniform random token ids drawn per `salt` (the rate point's index): no two
prompts share a 16-token block, so a worker's prefix cache cannot serve one
rate point with an earlier point's work.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

FIRST_TOKEN_ID = 3
"""Ids below this are special (pad/bos/eos) in the presets' vocabularies."""


@dataclass(frozen=True, slots=True)
class RequestClass:
    """Length ranges of one kind of request (both ends inclusive)."""

    name: str
    prompt_tokens: tuple[int, int]
    """Prompt length range, tokens."""
    output_tokens: tuple[int, int]
    """Output length range (max_tokens, EOS ignored), tokens."""

    def __post_init__(self) -> None:
        for lo, hi in (self.prompt_tokens, self.output_tokens):
            assert 1 <= lo <= hi, (self.name, lo, hi)
        # TPOT needs at least two output tokens.
        assert self.output_tokens[0] >= 2, self.name

    @property
    def median_prompt_tokens(self) -> int:
        """Middle of the prompt range (what calibration measures)."""
        return sum(self.prompt_tokens) // 2

    @property
    def median_output_tokens(self) -> int:
        """Middle of the output range."""
        return sum(self.output_tokens) // 2


@dataclass(frozen=True, slots=True)
class Workload:
    """A request mix and an arrival process."""

    name: str
    mix: tuple[tuple[str, float], ...]
    """(class name, probability) pairs; probabilities sum to 1."""
    arrivals: str
    """'poisson' (exponential gaps), or 'bursty': bursts of 1..max_burst requests
    (uniform), the requests of a burst `burst_gap_unit` apart on average
    (exponential), bursts `burst_spacing_shape`-gamma distributed apart."""
    max_burst: int = 1
    """Largest burst ('bursty' only)."""
    burst_gap_unit: float = 0.02
    """Mean gap inside a burst, in units of the mean gap between requests."""
    burst_spacing_shape: float = 2.0
    """Gamma shape of the gaps between bursts (1 = Poisson bursts; 2 = more regular,
    so a dozen requests do not pile several bursts on top of each other)."""
    requests_per_rate: int = 12
    """Requests sent at each rate point."""

    @property
    def mean_burst(self) -> float:
        """Mean requests per burst (1 for Poisson arrivals)."""
        return (1 + self.max_burst) / 2 if self.arrivals == "bursty" else 1.0

    def __post_init__(self) -> None:
        assert abs(sum(p for _, p in self.mix) - 1.0) < 1e-9, self.mix
        assert self.arrivals in ("poisson", "bursty"), self.arrivals
        assert self.max_burst >= 1 and self.requests_per_rate >= 1


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a trace."""

    index: int
    cls: str
    """Request class name (selects its SLO)."""
    prompt_ids: list[int]
    max_tokens: int
    arrival_unit_s: float
    """Arrival time at 1 request/s; divide by the rate."""
    seed: int


def request_classes(quick: bool) -> dict[str, RequestClass]:
    """The two request classes.

    `long`: prompts >= 8x their outputs (prefill-heavy); `short`: prompts about
    equal to outputs (decode-heavy). The quick smoke run halves the long class
    (keeping the 8x ratio) so it fits in a couple of minutes.
    """
    if quick:
        long = RequestClass("long", prompt_tokens=(512, 1024), output_tokens=(32, 64))
    else:
        long = RequestClass("long", prompt_tokens=(1024, 2048), output_tokens=(64, 128))
    short = RequestClass("short", prompt_tokens=(32, 128), output_tokens=(32, 128))
    assert long.prompt_tokens[0] >= 8 * long.output_tokens[1]
    return {"long": long, "short": short}


def workloads(quick: bool) -> dict[str, Workload]:
    """`long` (bursts of 1-3), `short` (Poisson) and `mixed` (a quarter long, Poisson)."""
    n = (3, 4, 4) if quick else (12, 40, 16)
    return {
        "long": Workload("long", (("long", 1.0),), "bursty", max_burst=3, requests_per_rate=n[0]),
        "short": Workload("short", (("short", 1.0),), "poisson", requests_per_rate=n[1]),
        "mixed": Workload("mixed", (("long", 0.25), ("short", 0.75)), "poisson", requests_per_rate=n[2]),
    }


def arrival_times(w: Workload, rng: random.Random) -> list[float]:
    """w.requests_per_rate arrival times, the first at 0 and the last at n - 1.

    Scaling the span to n - 1 makes the trace's realized rate exactly its
    nominal rate (1 per unit), so a rate point's label is the rate it sent.
    Bursts are bounded (not a gamma process of requests): with unbounded
    clustering, a burst of k long prompts arriving together misses any fixed
    TTFT objective at every rate, so attainment would never reach the target
    however low the rate.
    """
    times: list[float] = []
    t = 0.0
    mean_burst = w.mean_burst
    while len(times) < w.requests_per_rate:
        size = rng.randint(1, w.max_burst) if w.arrivals == "bursty" else 1
        for k in range(size):
            if k:
                t += rng.expovariate(1.0 / w.burst_gap_unit)
            times.append(t)
        # A burst of mean size m every m units on average: mean rate 1.
        shape = w.burst_spacing_shape if w.arrivals == "bursty" else 1.0
        t += rng.gammavariate(shape, mean_burst / shape)
    times = times[:w.requests_per_rate]
    span = times[-1]
    if len(times) < 2 or span <= 0:
        return [0.0] * len(times)
    return [x * (len(times) - 1) / span for x in times]


def random_prompt(rng: random.Random, n_tokens: int, vocab_size: int) -> list[int]:
    """n uniform random token ids (no special ids)."""
    return [rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(n_tokens)]


def trace(w: Workload, classes: dict[str, RequestClass], seed: int, vocab_size: int,
          salt: int = 0) -> list[Request]:
    """w.requests_per_rate seeded requests; the first arrives at 0.

    Classes, lengths, gaps and sampling seeds depend on (w, seed) only; the
    prompt token ids also on `salt`.
    """
    rng = random.Random(f"{w.name}/{seed}")
    content = random.Random(f"{w.name}/{seed}/content/{salt}")
    names = [c for c, _ in w.mix]
    weights = [p for _, p in w.mix]
    out = []
    for i, t in enumerate(arrival_times(w, rng)):
        c = classes[rng.choices(names, weights)[0]]
        prompt = random_prompt(content, rng.randint(*c.prompt_tokens), vocab_size)
        out.append(Request(i, c.name, prompt, rng.randint(*c.output_tokens), t, rng.randrange(2**31)))
    return out


def describe(w: Workload, classes: dict[str, RequestClass]) -> dict:
    """JSON-ready description of a workload, its classes included."""
    return {**asdict(w), "mix": dict(w.mix),
            "classes": {c: asdict(classes[c]) for c, _ in w.mix}}
