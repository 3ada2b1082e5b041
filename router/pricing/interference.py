"""Interference: does running this prompt's prefill on a worker stall decode streams
past their TPOT target?

A prefill on a worker that also decodes (a colocated route's W, or the P of a
split route when P is a mixed worker) holds that worker's decode steps back:
chunked prefill interleaves one chunk with one step, so every stream there
waits for the whole prefill in pieces. Spread over what is left of a stream's
output, that is `prefill_ms / remaining` ms on every one of its tokens.

The request's own TPOT prediction (router/pricing/decision.py) already carries the
stall that *its* prompt and the queued ones cause it. This module prices the
stall the streams beside it suffer, assuming a stream there is like this
request, halfway through (remaining = (max_tokens - 1) / 2 tokens):

* colocated on W: harmful when W's step + stall > target, with W's current
  step when W decodes, else the step of one stream. Colocating such a prompt
  makes W a worker where prompts like it stall streams like it past their
  target, whether or not W decodes anything at this instant — the next such
  prompt lands beside this one's stream. The step does not include this
  request's own stream, as a split's P does not: near saturation the two
  routes' checks then agree, instead of sending short prompts split because
  one more stream tipped the colocated step over the target. Short prompts
  (stall of a few ms) are never harmful; long ones are when the target is
  tight. This is the trade disaggregation offers: split when the interference avoided is
  worth the transfer.
* split P -> D: harmful when P can decode, P has streams now (batch > 0) and
  P's step + stall > target, the stall counting the prompts queued ahead on P
  too: they are the other prefills sent to P, and P's streams wait for all of
  them (counting this prompt alone let the second and third prompts of a burst
  each pass the check on a P whose stream then waited for both). A colocated
  W's check leaves its queue out: it asks whether prompts like this one make W
  a place where streams like it stall, and the queue is made of short prompts
  as often as long ones; counting it sent short prompts split near saturation,
  to a P whose streams stall as much. A dedicated prefill worker is never
  harmful.

The decision chooses among the routes `eligible` returns: feasible ones that
are not harmful; of those, ones that do not spend the cluster's last calm
prefill capacity on a long prompt's decode (`spends_reserve`); when every
feasible route stalls streams decoding now, a calm one that misses only TTFT
(one late first token instead of a stall on every stream beside the prefill).
The rules rank; they never reject. No target (tpot 0) means nothing is
harmful.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from router.pricing.candidate import D_STREAMS, DECODE, DISTURB, PREFILL, QUEUE_MS, ROUTE, STALLED, TPOT, TTFT, Row
from router.pricing.worker_costs import WorkerCosts
from router.types import Route


def remaining_tokens(max_tokens: int) -> float:
    """Tokens left to a stream assumed halfway through an output like this one."""
    return max(1.0, (max_tokens - 1) / 2.0)


def stall_per_token_ms(own_prefill_ms: float, max_tokens: int) -> float:
    """What this prefill adds to each token of a stream beside it."""
    return own_prefill_ms / remaining_tokens(max_tokens)


def colocated_disturb_ms(w: WorkerCosts, own_prefill_ms: float, max_tokens: int, end_ms: float = math.inf) -> float:
    """TPOT of the streams beside this prompt's prefill on W, which ends `end_ms` from
    now (default: late, overlapping every stream): W's live streams at W's current
    step (this request's own stream is priced by its own TPOT); streams planned onto
    W, for the part of the prefill after the first one starts (0 when the prefill
    ends before: it disturbs nobody); on an idle W with nothing planned, a later
    stream like this one (a step of one)."""
    step = w.step_ms if w.batch > 0 else w.tpot_base
    if w.live > 0 or w.planned <= 0:
        return step + stall_per_token_ms(own_prefill_ms, max_tokens)
    over = w.overlap_ms(own_prefill_ms, end_ms)
    return step + stall_per_token_ms(over, max_tokens) if over > 0 else 0.0


def split_disturb_ms(p: WorkerCosts, own_prefill_ms: float, max_tokens: int, end_ms: float = math.inf) -> float:
    """TPOT of P's streams while this prompt (and P's queued ones) prefill on P, ending
    `end_ms` from now; 0 when P cannot decode, or has no stream during it (none live,
    and none planned to start before it ends)."""
    if not p.can_decode:
        return 0.0
    over = p.overlap_ms(p.queue_ms + own_prefill_ms, end_ms)
    if over <= 0:
        return 0.0
    return (p.step_ms if p.batch > 0 else p.tpot_base) + stall_per_token_ms(over, max_tokens)


def stalled_streams(w: WorkerCosts, end_ms: float) -> int:
    """Streams at W that a prefill there ending `end_ms` from now holds back: the live
    ones, and the planned ones when it runs past the first planned start."""
    return w.live + (w.planned if end_ms > w.next_start_ms else 0)


def harmful(disturb_tpot_ms: float, slo_tpot_ms: float) -> bool:
    """A target is set and the disturbed streams would miss it."""
    return slo_tpot_ms > 0 and disturb_tpot_ms > slo_tpot_ms


def spends_reserve(row: Row, max_tokens: int, slo_tpot_ms: float) -> bool:
    """The route puts this request's stream on a stream-free worker able to prefill
    (a mixed D, or W colocated) where the next prefill would hold that stream past
    the target. Such a worker is the cluster's calm prefill capacity: a later long
    prompt can prefill on it without stalling anybody, but not once this stream
    lives there. The next prefill there is taken to be like this prompt on a split
    route, and like the prompts queued on W (prompts W now prefills for others: it
    is acting as a prefill worker) on a colocated one."""
    if row[D_STREAMS] != 0 or not row[DECODE].can_prefill:
        return False
    nxt = row[PREFILL] if row[ROUTE] is Route.DISAGGREGATED else row[QUEUE_MS]
    return nxt > 0 and harmful(row[TPOT] + stall_per_token_ms(nxt, max_tokens), slo_tpot_ms)


class Eligible(NamedTuple):
    """`eligible`'s answer, by index into the priced rows."""

    at: list[int]
    """The routes the decision may choose from; empty when none is feasible."""
    feasible: list[int]
    """The routes that meet both targets."""
    note: str
    """Why any were set aside (appended to the decision's reason)."""
    late: bool
    """`at` holds calm routes that meet TPOT and miss TTFT (rule 3)."""


def eligible(rows: Sequence[Row], slo_ttft_ms: float, slo_tpot_ms: float, max_tokens: int) -> Eligible:
    """Which priced routes (Rows, router/pricing/candidate.py; by index) the decision may
    choose from, why any were set aside, and whether they are *late* (meet TPOT,
    miss TTFT). Empty: no route meets both targets (the decision rejects, or
    admits the closest).

    1. Feasible routes: both predictions meet their targets.
    2. Of those, the calm ones (no stall past the target) when any; of the calm
       ones, those that keep a calm prefill worker (not `spends_reserve`) when any.
    3. Every feasible route stalls streams past the target: when each of them
       stalls streams decoding *now*, a calm route that meets TPOT and misses
       only TTFT is taken instead (one late first token, rather than a stall on
       every stream beside the prefill); else the feasible routes that stall the
       fewest streams decoding now (none: only later ones like this request's).
       That also settles mixed workers into roles under long prompts: the one
       with fewer streams prefills, and the streams gather where streams are.
    """
    st, sp = slo_ttft_ms, slo_tpot_ms
    feasible = [i for i, r in enumerate(rows) if not ((st > 0 and r[TTFT] > st) or (sp > 0 and r[TPOT] > sp))]
    if not feasible or sp <= 0:  # no TPOT target: nothing is harmful
        return Eligible(feasible, feasible, "", False)
    calm = [i for i in feasible if rows[i][DISTURB] <= sp]
    if calm:
        at, note = _reserve(rows, calm, sp, max_tokens)
        if len(calm) < len(feasible):
            note = (f"; {len(feasible) - len(calm)} feasible route(s) set aside for interference (their prefill "
                    f"would hold decode streams past the TPOT target)") + note
        return Eligible(at, feasible, note, False)
    if all(rows[i][STALLED] > 0 for i in feasible):
        late = [i for i, r in enumerate(rows) if st > 0 and r[TTFT] > st and r[TPOT] <= sp and r[DISTURB] <= sp]
        if late:
            return Eligible(late, feasible, "; every route meeting the SLO would hold decode streams past the TPOT "
                                            "target with its prefill, so a calm route that misses only TTFT is taken",
                            True)
    return Eligible(least_stalled(rows, feasible), feasible, "", False)


def least_stalled(rows: Sequence[Row], among: Sequence[int]) -> list[int]:
    """The routes of `among` whose prefill holds back the fewest streams decoding now."""
    least = min(rows[i][STALLED] for i in among)
    return [i for i in among if rows[i][STALLED] == least]


def _reserve(rows: Sequence[Row], calm: list[int], sp: float, max_tokens: int) -> tuple[list[int], str]:
    """`calm` less the routes that spend the last calm prefill worker, when any remain."""
    spend = [i for i in calm if spends_reserve(rows[i], max_tokens, sp)]
    if not spend or len(spend) == len(calm):
        return calm, ""
    return [i for i in calm if i not in spend], (f"; {len(spend)} route(s) set aside to keep a stream-free worker "
                                                 f"for the next long prefill")
