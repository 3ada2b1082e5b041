"""The tokens a request has forwarded to its client, across attempts.

Exactness (docs/design.md, Principles) makes a retry after partial output seamless: the next
attempt resumes after all but the last forwarded token (`resume_point`; its prompt is
followed by them, replayed as decode computed them), so its first token is the last one
forwarded, computed again; a token below the forwarded count is compared with what the
client already has and suppressed (its log-probabilities with it: the client has the
first ones); a mismatch is a correctness bug and ends the request
with INTERNAL ("divergence at index i"). Also measures TTFT and TPOT at the router.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from router.requests.text import Detokenizer
from router.types import Completed, FinishReason, Route, RouterError, StatusCode, TokenLogprobs, TokenOut


class OutputLog:
    """Forwarded tokens, their timing, and the continuation check."""

    def __init__(self, start_s: float, clock: Callable[[], float] = time.monotonic, tokenizer: Any | None = None):
        self._start_s = start_s
        self._clock = clock
        self._detok = Detokenizer(tokenizer)
        self.tokens: list[int] = []
        self._first_s: float | None = None
        self._decoding_s: float | None = None
        """When a decode worker's token 0 came (the prefill's may have gone out before)."""

    def offer(self, index: int, token_id: int, generation: int, decoding: bool = True,
              logprobs: TokenLogprobs | None = None) -> TokenOut | None:
        """A token from an attempt: the event to forward, or None when it replays an
        already-forwarded token. Raises RouterError(INTERNAL) on divergence. `decoding`
        False: a prefill's token 0 (TokenOut.decoding); `logprobs` go out with it."""
        now = self._clock()
        if decoding and index == 0:
            self._decoding_s = now
        if index < len(self.tokens):
            if self.tokens[index] != token_id:
                raise RouterError(StatusCode.INTERNAL,
                                  f"divergence at index {index}: generation {generation} produced token "
                                  f"{token_id}, the client already has {self.tokens[index]}")
            return None
        assert index == len(self.tokens), "attempts stream indices in order from 0"
        if self._first_s is None:
            self._first_s = now
        self.tokens.append(token_id)
        return TokenOut(token_id, self._detok.add(token_id), index, self._ms(now), decoding, logprobs)

    def resume_point(self) -> int:
        """How many forwarded tokens the next attempt replays as prompt: all but the last,
        which it computes again and `offer` checks, so the attempt also ends as the
        uninterrupted run ended when that token was its last (an EOS the router cannot
        tell from another token). With one forwarded, none: the attempt starts over."""
        return max(0, len(self.tokens) - 1)

    def check_finished(self, num_tokens: int, generation: int) -> None:
        """An attempt completed after `num_tokens` tokens; it must not stop short of
        what was already forwarded."""
        if num_tokens < len(self.tokens):
            raise RouterError(StatusCode.INTERNAL,
                              f"divergence at index {num_tokens}: generation {generation} finished after "
                              f"{num_tokens} tokens, the client already has {len(self.tokens)}")

    def completed(self, finish_reason: FinishReason, route: Route, attempts: int, prefill_kv_digest: str = "",
                  decode_kv_digest: str = "", failed_attempts: str = "") -> Completed:
        """The Complete event: TTFT, TPOT = (latency - TTFT) / (n - 1); the same from the
        decode's token 0 when a prefill's came first (Completed.decode_ttft_ms)."""
        latency_ms = self._ms(self._clock())
        n = len(self.tokens)
        ttft_ms = self._ms(self._first_s) if self._first_s is not None else 0.0
        tpot_ms = (latency_ms - ttft_ms) / (n - 1) if n > 1 else 0.0
        decoding = None if self._decoding_s in (None, self._first_s) else self._ms(self._decoding_s)
        return Completed(finish_reason, ttft_ms, tpot_ms, n, route, attempts, prefill_kv_digest, decode_kv_digest,
                         failed_attempts, decoding, None if decoding is None else
                         (latency_ms - decoding) / (n - 1) if n > 1 else 0.0, text_tail=self._detok.rest())

    def _ms(self, t: float) -> float:
        return (t - self._start_s) * 1000.0
