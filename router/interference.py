"""Interference: does running this prompt's prefill on a worker stall decode streams
past their TPOT target?

A prefill on a worker that also decodes (a colocated route's W, or the P of a
split route when P is a mixed worker) holds that worker's decode steps back:
chunked prefill interleaves one chunk with one step, so every stream there
waits for the whole prefill in pieces. Spread over what is left of a stream's
output, that is `prefill_ms / remaining` ms on every one of its tokens.

The request's own TPOT prediction (router/decision.py) already carries the
stall that *its* prompt and the queued ones cause it. This module prices the
stall it causes *others*, assuming a stream there is like this request, halfway
through (remaining = (max_tokens - 1) / 2 tokens):

* colocated on W: harmful when W's step + stall > target, with W's current
  step when W decodes, else the step of one stream. Colocating such a prompt
  makes W a worker where prompts like it stall streams like it past their
  target, whether or not W decodes anything at this instant — the next such
  prompt lands beside this one's stream. The step does not include this
  request's own stream, as a split's P does not: near saturation the two
  routes' checks then agree, instead of sending short prompts split because
  one more stream tipped the colocated step over the target. Short prompts
  (stall of a few ms) are never harmful; long ones are when the target is
  tight. This is the article's trade: split when the interference avoided is
  worth the transfer.
* split P -> D: harmful when P can decode, P has streams now (batch > 0) and
  P's step + stall > target. A dedicated prefill worker is never harmful.

The decision prefers feasible candidates that are not harmful; when every
feasible candidate is, it chooses among all of them as before (the rule ranks,
it never rejects). No target (tpot 0) means nothing is harmful.
"""

from __future__ import annotations

from router.cost_model import WorkerCosts


def remaining_tokens(max_tokens: int) -> float:
    """Tokens left to a stream assumed halfway through an output like this one."""
    return max(1.0, (max_tokens - 1) / 2.0)


def stall_per_token_ms(own_prefill_ms: float, max_tokens: int) -> float:
    """What this prefill adds to each token of a stream beside it."""
    return own_prefill_ms / remaining_tokens(max_tokens)


def colocated_disturb_ms(w: WorkerCosts, own_prefill_ms: float, max_tokens: int) -> float:
    """TPOT of the streams beside this prompt's prefill on W: W's current streams at
    W's current step (this request's own stream is priced by its own TPOT), or, on
    an idle W, a later stream like this one (a step of one)."""
    step = w.step_ms if w.batch > 0 else w.tpot_base
    return step + stall_per_token_ms(own_prefill_ms, max_tokens)


def split_disturb_ms(p: WorkerCosts, own_prefill_ms: float, max_tokens: int) -> float:
    """TPOT of P's streams while this prompt prefills on P; 0 when P has none (or cannot decode)."""
    if not p.can_decode or p.batch <= 0:
        return 0.0
    return p.step_ms + stall_per_token_ms(own_prefill_ms, max_tokens)


def harmful(disturb_tpot_ms: float, slo_tpot_ms: float) -> bool:
    """A target is set and the disturbed streams would miss it."""
    return slo_tpot_ms > 0 and disturb_tpot_ms > slo_tpot_ms
