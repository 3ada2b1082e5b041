"""The load a drill runs under: seeded prompts sent at a fixed rate through the router,
greedy, `ignore_eos`, no mode (the release decides the route), and the colocated re-run
every answer is compared with.

The rate is open-loop (request i is due at start + i / rate) up to `concurrency`
requests in flight: a cluster slower than the rate is sent fewer requests, not a queue
of them, and the report counts what was sent.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pdserve_client.types import GenerationResult, PdError

PROMPT_TOKENS = (16, 96)
"""Prompt lengths drawn from this range: more than one K/V block, short enough to be quick."""
TOKEN_IDS = (3, 500)
"""Prompt token ids drawn from this range: every vocabulary has them, none is special."""


def prompt(seed: int, index: int) -> list[int]:
    """Request `index`'s prompt in the drill seeded `seed` (the same on every run)."""
    rng = random.Random(f"{seed}:{index}")
    return [rng.randrange(*TOKEN_IDS) for _ in range(rng.randrange(*PROMPT_TOKENS))]


@dataclass(slots=True)
class Sent:
    """One load request and how it ended."""

    index: int
    request_id: str
    prompt: list[int]
    sent_at_s: float
    """time.monotonic() when sent."""
    result: GenerationResult | None = None
    error: str = ""
    done_at_s: float = 0.0
    """time.monotonic() when it ended (0 while in flight)."""


class Load:
    """Requests at `rate_rps`, at most `concurrency` in flight, until `stop()`.

    `sdk` is an SDK client (or the fake's); it is shared by the sending threads."""

    def __init__(self, sdk, rate_rps: float, concurrency: int, max_tokens: int, seed: int,
                 slo_ttft_ms: float = 0.0, slo_tpot_ms: float = 0.0):
        self._sdk = sdk
        self._slo = {k: v for k, v in (("slo_ttft_ms", slo_ttft_ms), ("slo_tpot_ms", slo_tpot_ms)) if v}
        """Targets each request carries (none: the router's configured ones)."""
        self.rate_rps, self.concurrency, self.max_tokens, self.seed = rate_rps, concurrency, max_tokens, seed
        self.run_id = uuid.uuid4().hex[:8]
        self.sent: list[Sent] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._next = 0
        self._threads: list[threading.Thread] = []
        self.started_s = 0.0

    def start(self) -> None:
        """Start sending."""
        self.started_s = time.monotonic()
        # Daemon threads: a Ctrl-C ends the drill without waiting for requests in flight
        # (closing the client cancels them).
        self._threads = [threading.Thread(target=self._send, name=f"drill-load-{i}", daemon=True)
                         for i in range(self.concurrency)]
        for t in self._threads:
            t.start()

    def _send(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                i = self._next
                self._next += 1
            if self._stop.wait(max(0.0, self.started_s + i / self.rate_rps - time.monotonic())):
                return
            s = Sent(i, f"drill-{self.run_id}-{i}", prompt(self.seed, i), time.monotonic())
            with self._lock:
                self.sent.append(s)
            result, error = None, ""
            try:
                result = self._sdk.generate_full(prompt_ids=s.prompt, max_tokens=self.max_tokens,
                                                 ignore_eos=True, request_id=s.request_id, **self._slo)
            except PdError as exc:
                error = f"{exc.code}: {exc.message}"
            except Exception as exc:  # noqa: BLE001 — a drill reports every failure, whatever raised it
                error = f"{type(exc).__name__}: {exc}"
            with self._lock:
                if not s.done_at_s:  # else `stop` gave up on it and reported it: the report stands
                    s.result, s.error, s.done_at_s = result, error, time.monotonic()

    def done(self, route: str | None = None, before_s: float = float("inf"), after_s: float = 0.0) -> int:
        """Requests that succeeded (on `route` if given), sent after `after_s` and ended before `before_s`."""
        with self._lock:
            return sum(1 for s in self.sent if s.result is not None and s.done_at_s < before_s
                       and s.sent_at_s >= after_s and (route is None or s.result.route == route))

    def failed(self, after_s: float = 0.0) -> int:
        """Requests sent after `after_s` that ended in an error."""
        with self._lock:
            return sum(1 for s in self.sent if s.error and s.sent_at_s >= after_s)

    def stop(self, timeout_s: float) -> list[Sent]:
        """Send no more; wait up to `timeout_s` for the requests in flight. Returns every
        request sent (one still in flight past the wait ends as an error)."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            for s in self.sent:
                if not s.done_at_s:
                    s.error, s.done_at_s = f"no answer within {timeout_s:g} s of the load's end", time.monotonic()
            return sorted(self.sent, key=lambda s: s.index)

    def abort(self) -> None:
        """Send no more, wait for nothing (Ctrl-C)."""
        self._stop.set()


@dataclass(slots=True)
class Comparison:
    """Load answers against colocated re-runs of the same prompts."""

    compared: int
    mismatches: list[str]
    """One line per request whose tokens differ, or whose re-run failed."""


def compare_colocated(sdk, sent: list[Sent], max_tokens: int, concurrency: int) -> Comparison:
    """Re-run every succeeded request's prompt with mode colocated (greedy, so the tokens
    must be equal whatever route served it first) and compare token ids."""
    done = [s for s in sent if s.result is not None]

    def one(s: Sent) -> str:
        try:
            again = sdk.generate_full(prompt_ids=s.prompt, max_tokens=max_tokens, ignore_eos=True,
                                      mode="colocated", request_id=f"{s.request_id}-colocated")
        except PdError as exc:
            return f"{s.request_id}: the colocated re-run failed: {exc.code}: {exc.message}"
        if again.route != "colocated":
            return f"{s.request_id}: the colocated re-run ran {again.route}"
        a, b = s.result.token_ids, again.token_ids
        if a == b:
            return ""
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        workers = f"{s.result.prefill_worker}->{s.result.decode_worker}" if s.result.prefill_worker \
            else s.result.decode_worker
        return (f"{s.request_id} ({s.result.route} on {workers or '?'}): {len(a)} tokens vs colocated {len(b)}, "
                f"first differs at token {first}")

    with ThreadPoolExecutor(concurrency) as pool:
        lines = list(pool.map(one, done))
    return Comparison(len(done), [line for line in lines if line])
