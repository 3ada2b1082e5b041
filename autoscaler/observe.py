"""The observed load: the routers' /metrics, scraped and differenced over a window.

Each router counts every completed request in two histograms (runtime/telemetry/
catalog.py: `pd_request_prompt_tokens`, `pd_request_generation_tokens`, buckets 1, 2,
4 ... 32768 tokens). A scrape is parsed with prometheus_client's parser into a `Reading`
(cumulative bucket counts); the load is the increase between the oldest reading inside
the window and the newest, summed over the routers:

    rate_rps        completed requests per second
    prompt_tokens   histogram of the completed requests' prompt lengths
    output_tokens   histogram of their output lengths

A router whose counts went down restarted: its newest reading counts from zero (what
Prometheus' rate() assumes). Scraping presents this process's certificate (the
`monitor` role: runtime/telemetry/endpoint.py lets only operator and monitor read) and
checks the router's against the cluster's CA, as every scraper here does.
"""

from __future__ import annotations

import math
import random
import socket
import ssl
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

PROMPT_FAMILY = "pd_request_prompt_tokens"  # Must match RouterMetrics.request_prompt_tokens (runtime/telemetry)
OUTPUT_FAMILY = "pd_request_generation_tokens"  # Must match RouterMetrics.request_generation_tokens


@dataclass(frozen=True, slots=True)
class TokenHistogram:
    """Requests per length bucket: `counts[i]` requests of at most `edges[i]` tokens and more
    than `edges[i-1]` (the last edge is inf)."""

    edges: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        """Requests counted."""
        return sum(self.counts)

    def quantile(self, q: float) -> float:
        """The bucket edge at or above which a share `q` of the requests lies (0 when empty;
        the last finite edge for the +Inf bucket)."""
        assert 0 <= q <= 1, q
        total, seen = self.total, 0.0
        for edge, n in zip(self.edges, self.counts):
            seen += n
            if total and seen >= q * total:
                return self._finite(edge)
        return 0.0

    def sample(self, n: int, seed: int = 0) -> list[int]:
        """`n` lengths drawn from the histogram (uniform within a bucket); [] when empty."""
        if not self.total or n <= 0:
            return []
        rng = random.Random(seed)
        lows = (0.0, *self.edges[:-1])
        picks = rng.choices(range(len(self.counts)), weights=self.counts, k=n)
        return [max(1, round(rng.uniform(lows[i], self._finite(self.edges[i])))) for i in picks]

    def _finite(self, edge: float) -> float:
        return edge if math.isfinite(edge) else max((e for e in self.edges if math.isfinite(e)), default=0.0)

    def __sub__(self, older: TokenHistogram) -> TokenHistogram:
        assert self.edges == older.edges, (self.edges, older.edges)
        return TokenHistogram(self.edges, tuple(a - b for a, b in zip(self.counts, older.counts)))

    def __add__(self, other: TokenHistogram) -> TokenHistogram:
        if not other.edges:
            return self
        if not self.edges:
            return other
        assert self.edges == other.edges, (self.edges, other.edges)
        return TokenHistogram(self.edges, tuple(a + b for a, b in zip(self.counts, other.counts)))


EMPTY = TokenHistogram((), ())


@dataclass(frozen=True, slots=True)
class ObservedLoad:
    """Completed requests over the last `window_s` seconds, and their length mix."""

    rate_rps: float
    prompt_tokens: TokenHistogram
    output_tokens: TokenHistogram
    window_s: float
    requests: float
    routers: int
    """Routers whose readings went into it."""

    def describe(self) -> str:
        """One line: rate, and median and p90 lengths."""
        p, o = self.prompt_tokens, self.output_tokens
        return (f"{self.rate_rps:.2f} rps over {self.window_s:.0f} s ({self.requests:.0f} requests, "
                f"{self.routers} router(s)) at p50/p90 prompt {p.quantile(0.5):.0f}/{p.quantile(0.9):.0f}, "
                f"output {o.quantile(0.5):.0f}/{o.quantile(0.9):.0f} tokens")

    def to_dict(self) -> dict:
        """JSON-ready, for the status record."""
        return {"rate_rps": self.rate_rps, "window_s": self.window_s, "requests": self.requests,
                "routers": self.routers, "summary": self.describe(),
                "prompt_tokens": {"edges": [str(e) for e in self.prompt_tokens.edges],
                                  "counts": list(self.prompt_tokens.counts)},
                "output_tokens": {"edges": [str(e) for e in self.output_tokens.edges],
                                  "counts": list(self.output_tokens.counts)}}


@dataclass(frozen=True, slots=True)
class Reading:
    """One router's cumulative histograms at one time."""

    at_s: float
    prompt: TokenHistogram
    output: TokenHistogram

    @property
    def count(self) -> float:
        """Requests completed since the router started."""
        return self.prompt.total


def _buckets(samples: Iterable) -> TokenHistogram:
    """Non-cumulative counts by upper edge from a histogram family's _bucket samples."""
    cumulative: dict[float, float] = {}
    for s in samples:
        if s.name.endswith("_bucket"):
            edge = float(s.labels["le"])
            cumulative[edge] = cumulative.get(edge, 0.0) + s.value  # summed over any other labels
    edges = tuple(sorted(cumulative))
    running = [cumulative[e] for e in edges]
    return TokenHistogram(edges, tuple(b - a for a, b in zip([0.0, *running[:-1]], running)))


def parse_reading(text: str, at_s: float) -> Reading:
    """A router's exposition (Prometheus text) -> its Reading; ValueError if it lacks the families."""
    families = {f.name: f for f in text_string_to_metric_families(text)}
    missing = [n for n in (PROMPT_FAMILY, OUTPUT_FAMILY) if n not in families]
    if missing:
        raise ValueError(f"no {', '.join(missing)} in the scrape (a router older than the autoscaler?)")
    return Reading(at_s, _buckets(families[PROMPT_FAMILY].samples), _buckets(families[OUTPUT_FAMILY].samples))


def scrape(url: str, context: ssl.SSLContext | None, timeout_s: float = 5.0) -> str:
    """GET `url` (HTTPS presenting `context`'s certificate; plain HTTP when None)."""
    with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout_s, context=context) as resp:
        return resp.read().decode()


def service_urls(host_port: str, scheme: str) -> list[str]:
    """The /metrics URL of every address `host`:`port` resolves to (a headless Service: one
    per ready router pod)."""
    host, _, port = host_port.rpartition(":")
    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    addrs = sorted({i[4][0] for i in infos})
    return [f"{scheme}://{f'[{a}]' if ':' in a else a}:{port}/metrics" for a in addrs]


class Observer:
    """Scrapes the routers `urls()` names at each `observe()` and keeps each one's readings
    for `window_s`."""

    def __init__(self, urls: Callable[[], list[str]], context: ssl.SSLContext | None, window_s: float,
                 fetch: Callable[[str, ssl.SSLContext | None], str] = scrape,
                 clock: Callable[[], float] = time.monotonic):
        self.urls, self.context, self.window_s = urls, context, window_s
        self.fetch, self.clock = fetch, clock
        self._readings: dict[str, deque[Reading]] = {}

    def observe(self) -> ObservedLoad:
        """Scrape every router now; the load over the window (RuntimeError: no router answered,
        or none has two readings yet: the first call only starts the window)."""
        now, errors, fresh = self.clock(), [], set()
        urls = self.urls()
        for url in urls:
            try:
                reading = parse_reading(self.fetch(url, self.context), now)
            except (OSError, ValueError) as e:
                errors.append(f"{url}: {e}")
                continue
            fresh.add(url)
            kept = self._readings.setdefault(url, deque())
            kept.append(reading)
            while len(kept) > 2 and kept[1].at_s <= now - self.window_s:
                kept.popleft()  # keep one reading at or before the window's start
        for gone in set(self._readings) - set(urls):
            del self._readings[gone]  # a router pod that left
        if not fresh:
            raise RuntimeError("no router's /metrics answered: " + ("; ".join(errors) or "no router known"))
        return self._load([self._readings[u] for u in sorted(fresh)], errors)

    def _load(self, series: list[deque[Reading]], errors: list[str]) -> ObservedLoad:
        prompt, output, requests, rate, windows = EMPTY, EMPTY, 0.0, 0.0, []
        for kept in series:
            if len(kept) < 2:
                continue
            old, new = kept[0], kept[-1]
            restarted = new.count < old.count
            p, o = (new.prompt, new.output) if restarted else (new.prompt - old.prompt, new.output - old.output)
            window = new.at_s - old.at_s
            prompt, output, requests = prompt + p, output + o, requests + p.total
            rate += p.total / window
            windows.append(window)
        if not windows:
            raise RuntimeError("the first reading of each router starts the window; the load comes with the next"
                               + (f" (and {'; '.join(errors)})" if errors else ""))
        return ObservedLoad(rate, prompt, output, max(windows), requests, len(windows))

