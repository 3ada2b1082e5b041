"""The router's cost model: three functions, measured per worker, corrected online.

    prefill_ms(new, reused)        = a + b*new + c*new*(reused + new/2)     (per worker)
    decode_step_ms(batch, context) = d + e*batch + f*context                 (per worker)
    transfer_ms(bytes, P -> D)     = latency + bytes / bandwidth             (per path)

(a..f) come from the CostProfile each worker measured at start (runtime/worker/
profile.py) and registered; a worker without one gets the config's defaults.
A start-up calibration on a shared host can be several times too slow (other
workers start beside it), so every function carries a multiplicative
correction (router/pricing/corrections.py), an EWMA of observed / predicted that follows
samples up *and down*:

    prefill   per worker and per size (log2 bucket of new tokens), from
              PrefillResult.timings.compute_ms on split routes and, on colocated
              routes whose worker had no queue and whose predicted prefill
              dominates the fixed costs, from observed TTFT - overhead
    transfer  per path and per size (log2 bucket of bytes), from timings.transfer_ms
    decode    per worker, from each request's observed TPOT against its own
              predicted cadence: a plain EWMA step when nothing was planned onto
              the worker after it (clean), else a low-expectile step (a stream
              that saw later arrivals only bounds the step price from above)

Per size, because one factor learned from 2k-token prompts must not price a
90-token one (the fitted curve's shape is wrong in places; a bucket with no
sample borrows the nearest observed bucket's factor).

A per-route TTFT overhead (RPC hops; a split route's token 0 takes the
prefill's) is learned from TTFT residuals: every split TTFT (its prefill is
timed separately), and a colocated TTFT whose predicted prefill is below
PREFILL_DOMINANT x `fixed_cost_scale_ms()` (the configured split overhead).
Such a TTFT is not dominated by its prefill, and the fixed cost is the term a
measured calibration knows least:
read as prefill, ~10 ms of RPC on a 7 ms prompt on `tiny` became a 2.5x
prefill factor while the never-observed split route kept its 5 ms default, and
the next short request went split. A *clean* sample
(predicted queue at most CLEAN_QUEUE_SHARE of the prefill) is a plain EWMA step
(the first one sets it). Any other is a *low* expectile step: a residual below
the current value pulls it down at full weight, one above at a quarter weight
and capped at 4x the current value. Those residuals are mostly unmodelled
queueing (a burst whose queue the snapshot did not show yet), and a fixed
overhead that absorbed them would price every later request, idle or not, as
if it queued.

A split route runs on two clocks (docs/design.md, A request): its token 0 leaves
from the prefill as soon as it is sampled, and the decode streams the tokens after
it once the hand-off is done. Its TTFT is P's queue + prefill + the route's
overhead (the job's and token 0's hops, learned from the client's TTFT); its
decode starts `transfer + admission + handoff_lag_ms()` after that token 0, a
delay the client sees in its first token gap, so the route's TPOT holds it spread
over the request's gaps (WorkerCosts.tpot_with's extra). The lag is learned from
each split request's decode token 0 less its client token 0, net of the
predicted transfer and admission. A split route makes every hop a colocated one
makes, so its overhead is priced at least the colocated one's (an unobserved
split route never looks cheaper than the colocated overhead already seen).

`costs(worker)` folds profile, corrections and the worker's load into one
`WorkerCosts` row, so that pricing a route is a few multiply-adds
(router/pricing/decision.py); rows are cached per worker record and rebuilt when a
correction changes.

Invariant: every prediction is finite and >= 0; corrections stay within
[1/CLAMP, CLAMP] so one bad sample cannot zero or explode a worker's price.
"""

from __future__ import annotations

import collections
import math
import statistics
import time
from collections.abc import Callable

from router.config import RouterConfig
from router.pricing.candidate import Candidate
from router.pricing.corrections import CLAMP, Ewma, Sized, ratio
from router.pricing.formula import prefill_ms
from router.pricing.worker_costs import WorkerCosts
from router.types import Route, free_blocks_after
from runtime.directory.cost_profile import CostProfile
from runtime.directory.records import WorkerRecord

PREFILL_DOMINANT = 4.0
"""A colocated TTFT is a prefill sample of W only when its predicted prefill is at least this
multiple of the fixed-cost scale (then an error in the overhead moves the ratio by <= 1/4);
else it is an overhead sample."""

CLEAN_QUEUE_SHARE = 0.25
"""A TTFT is a clean sample (prefill: only then; overhead: a plain EWMA step) when the predicted
queue was at most this share of the prefill."""

DECODE_RECENT = 8
"""Recent decode observations kept per worker (implied factor, observed TPOT) for rejection."""

CONFIRM_SAMPLES = 3
"""A decode price is confirmed by at least this many recent observations ..."""

CONFIRM_AGREE = 1.5
"""... whose implied factors agree: the largest at most this multiple of the smallest."""


class CostModel:
    """Profiles, online corrections and the cached per-worker cost rows."""

    def __init__(self, config: RouterConfig, clock: Callable[[], float] = time.monotonic):
        self._cfg = config
        self._clock = clock
        self._evidence_s = config.reject_evidence_s
        self._alpha = config.cost_ewma_alpha
        self._default = CostProfile(prefill_ms_per_token=config.default_prefill_ms_per_token,
                                    decode_base_ms=config.default_decode_step_ms, source="default")
        self._prefill: dict[str, Sized] = {}
        self._decode: dict[str, Ewma] = {}
        self._decode_recent: dict[str, collections.deque[tuple[float, float, float]]] = {}
        """Per worker: (implied decode factor, observed TPOT ms, clock s) of its last DECODE_RECENT streams."""
        self._prefill_at: dict[str, float] = {}
        """Per worker: when a completion last corrected its prefill (clock s)."""
        self._path: dict[tuple[str, str], Sized] = {}
        self._path_all = Sized()
        self._default_overhead = {Route.DISAGGREGATED: config.disaggregated_overhead_ms,
                                  Route.COLOCATED: config.colocated_overhead_ms}
        self._overhead = {r: Ewma(v) for r, v in self._default_overhead.items()}
        self._split_overhead, self._colocated_overhead = self._overhead[Route.DISAGGREGATED], \
            self._overhead[Route.COLOCATED]  # the same Ewma objects: overhead_ms reads them per request
        self._lag = Ewma(config.handoff_overhead_ms)
        """A split route's decode after its token 0, beyond transfer and admission (`handoff_lag_ms`)."""
        self._latency_ms = config.transfer_latency_ms
        self._ms_per_byte = 1.0 / (config.transfer_mb_per_s * 1000.0)
        self._rows: dict[int, tuple[WorkerRecord, int, WorkerCosts]] = {}
        """id(record) -> (the record, its worker's row version then, its row without extras)."""
        self._row_version: dict[str, int] = {}
        """Per worker: bumped by the corrections its row carries (its prefill and decode
        factors); a cached row built under an older one is rebuilt. Transfer, overhead and
        lag corrections are read when a route is priced, not from the row."""

    # ---- pricing --------------------------------------------------------
    def profile(self, w: WorkerRecord) -> CostProfile:
        """The worker's declared profile, or the defaults when it declared none."""
        return w.profile if w.profile.declared else self._default

    def costs(self, w: WorkerRecord, extra_tokens: int = 0, extra_blocks: int = 0, extra_seqs: int = 0,
              streams: tuple[int, int, float] | None = None) -> WorkerCosts:
        """`w`'s cost row; `extra_*`: this router's dispatches its heartbeat does not
        show yet (prompt tokens queued, blocks reserved, sequences added to the batch);
        `streams`: this router's own streams at `w` (router/requests/streams.py): (started,
        planned and not started, ms until the first planned one starts)."""
        if extra_tokens or extra_blocks or extra_seqs:
            return self._build(w, extra_tokens, extra_blocks, extra_seqs, streams)
        version = self._row_version.get(w.worker_id, 0)
        hit = self._rows.get(id(w))
        if hit is not None and hit[0] is w and hit[1] == version:
            row = hit[2]
        else:
            row = self._build(w, 0, 0, 0)
            if len(self._rows) > 4096:
                self._rows.clear()
            self._rows[id(w)] = (w, version, row)
        if streams is None:
            return row
        return row.with_streams(max(row.batch, streams[0]), streams[1], streams[2])

    def _build(self, w: WorkerRecord, extra_tokens: int, extra_blocks: int, extra_seqs: int,
               streams: tuple[int, int, float] | None = None) -> WorkerCosts:
        p = self.profile(w)
        sized = self._prefill.get(w.worker_id)
        fp = sized.overall.value if sized else 1.0
        fd = self._decode.get(w.worker_id)
        fd = fd.value if fd else 1.0
        ld, cap = w.load, w.capacity
        free = free_blocks_after(w, extra_blocks)
        batch = max(0, ld.active_decode_batch + extra_seqs)
        # Streams decoding now: the report's, less those this router knows ended since (a
        # net give-back: the report was taken during them), or this router's started ones.
        live = max(0, ld.active_decode_batch + min(0, extra_seqs))
        return WorkerCosts(
            w, p.prefill_base_ms * fp, p.prefill_ms_per_token * fp, p.prefill_ms_per_pair * fp,
            p.decode_base_ms * fd, p.decode_ms_per_seq * fd, p.decode_ms_per_context_token * fd,
            p.kv_bytes_per_block, max(0, ld.pending_prefill_tokens + extra_tokens), free,
            batch,
            ld.active_context_tokens, cap.max_prefill_tokens or 256, cap.max_decode_batch,
            pre_scale=sized.scales() if sized else (),
            **({} if streams is None else
               {"live": max(live, streams[0]), "planned": streams[1], "next_start_ms": streams[2]}))

    def transfer_ms(self, source_id: str, dest_id: str, nbytes: int) -> float:
        """Exposed transfer time of `nbytes` from source to destination."""
        if nbytes <= 0:
            return 0.0
        f = self._path.get((source_id, dest_id)) or self._path_all
        return (self._latency_ms + nbytes * self._ms_per_byte) * f.factor(nbytes)

    def overhead_ms(self, route: Route) -> float:
        """Learned fixed TTFT overhead of a route kind; a split route's is at least
        the colocated one's (it makes the same hops plus the hand-off)."""
        if route is Route.DISAGGREGATED:
            return max(self._split_overhead.value, self._colocated_overhead.value)
        return self._colocated_overhead.value

    def handoff_lag_ms(self) -> float:
        """Learned: how much later than the prefill's token 0 a split route's decode
        streams, beyond the transfer and the admission (the hand-off's control plane:
        the grant, the COMMIT, validation and publication)."""
        return self._lag.value

    def fixed_cost_scale_ms(self) -> float:
        """The size of a route's fixed costs known before any sample: the configured
        split overhead. A colocated TTFT whose predicted prefill is below
        PREFILL_DOMINANT times this is an overhead sample, not a prefill one. (Not
        the learned overhead: a threshold that grew with what it let through would
        feed prefill errors into the overhead ever faster.)"""
        return self._default_overhead[Route.DISAGGREGATED]

    def prefill_confirmed(self, c: Candidate) -> bool:
        """Has a completion on this router corrected the computing worker's prefill, within
        the last `reject_evidence_s`?"""
        computing = c.prefill if c.prefill is not None else c.decode
        at = self._prefill_at.get(computing.worker_id)
        return at is not None and self._clock() - at <= self._evidence_s

    def decode_confirmed(self, worker_id: str) -> bool:
        """Is `worker_id`'s decode price confirmed: at least CONFIRM_SAMPLES recent
        observations (ended within `reject_evidence_s`) whose implied factors agree (within
        CONFIRM_AGREE), and the current factor no higher than the largest of them? One
        stream, or streams that disagree (interference the prediction did not know of), or
        old ones (what the worker did before the load went), confirm nothing."""
        recent = self._recent(worker_id)
        if len(recent) < CONFIRM_SAMPLES:
            return False
        last = [f for f, _, _ in recent[-CONFIRM_SAMPLES:]]
        return max(last) <= CONFIRM_AGREE * min(last) and self.decode_factor(worker_id) <= max(last) * 1.0001

    def observed_tpot_ms(self, worker_id: str) -> float | None:
        """Median TPOT of `worker_id`'s recent streams (ended within `reject_evidence_s`;
        None without any)."""
        recent = self._recent(worker_id)
        return statistics.median(ms for _, ms, _ in recent) if recent else None

    def _recent(self, worker_id: str) -> list[tuple[float, float, float]]:
        """`worker_id`'s recent decode observations still young enough to confirm a price."""
        recent = self._decode_recent.get(worker_id)
        if not recent:
            return []
        oldest = self._clock() - self._evidence_s
        return [o for o in recent if o[2] >= oldest]

    def confirmed(self, c: Candidate) -> bool:
        """Is `c` priced by more than the start-up calibration: the computing
        worker's prefill corrected by a completion, and D's (W's) decode confirmed
        by several agreeing recent streams (`decode_confirmed`)?"""
        return self.prefill_confirmed(c) and self.decode_confirmed(c.decode.worker_id)

    # ---- online correction ------------------------------------------------
    def observe_prefill(self, w: WorkerRecord, new: int, reused: int, observed_ms: float) -> None:
        """A prefill of `new` tokens after `reused` took `observed_ms` of compute at `w`."""
        p = self.profile(w)
        raw = prefill_ms(p.prefill_base_ms, p.prefill_ms_per_token, p.prefill_ms_per_pair, new, reused, 1.0)
        r = ratio(observed_ms, raw)
        if r is not None:
            self._prefill.setdefault(w.worker_id, Sized()).update(new, r, self._alpha)
            self._prefill_at[w.worker_id] = self._clock()
            self._row_changed(w.worker_id)

    def observe_transfer(self, source: WorkerRecord, dest: WorkerRecord, nbytes: int, observed_ms: float) -> None:
        """A hand-off of `nbytes` had `observed_ms` of exposed transfer time."""
        raw = self._latency_ms + nbytes * self._ms_per_byte
        r = ratio(observed_ms, raw)
        if r is not None:
            self._path.setdefault((source.worker_id, dest.worker_id), Sized()).update(nbytes, r, self._alpha)
            self._path_all.update(nbytes, r, self._alpha)

    def decode_factor(self, worker_id: str) -> float:
        """`worker_id`'s current decode correction (what a prediction made now carries)."""
        e = self._decode.get(worker_id)
        return e.value if e else 1.0

    def prefill_factor(self, worker_id: str, new: int) -> float:
        """`worker_id`'s current prefill correction for `new` tokens."""
        sized = self._prefill.get(worker_id)
        return sized.factor(new) if sized else 1.0

    def observe_tpot(self, w: WorkerRecord, predicted_ms: float, observed_ms: float, carried: float | None = None,
                     clean: bool = True) -> None:
        """A stream at `w` showed `observed_ms` per token where `predicted_ms` was
        priced, with decode factor `carried` (default: the current one).

        `clean`: nothing the prediction did not know of arrived at `w` during the
        stream. Then a plain EWMA step (the first one sets the factor). Otherwise
        the observed cadence includes later streams and the chunked prefills of
        later prompts (which decision.py prices separately, as dilation), so it is
        an upper bound on the step price: a low-expectile step (down at full
        weight, up at a quarter, capped), as for TTFT overheads. Folding that
        dilation into the factor priced it twice: a warm-up pair and one burst
        made a 22 ms stream look 88 ms and every later request was rejected.

        Safety invariant: compose with the factor the prediction *carried*, not the
        current one: requests of one burst are all priced before the first ends,
        and composing each with the factor its predecessors already raised
        compounded 2x into 4x, 8x (the 115 ms predicted for a 25 ms stream)."""
        r = ratio(observed_ms, predicted_ms)
        if r is None:
            return
        f = self.decode_factor(w.worker_id) if carried is None else carried
        implied = min(CLAMP, max(1 / CLAMP, r * f))
        self._decode_recent.setdefault(w.worker_id, collections.deque(maxlen=DECODE_RECENT)).append(
            (implied, observed_ms, self._clock()))
        if clean:
            self._update(self._decode, w.worker_id, implied)
        else:
            e = self._decode.setdefault(w.worker_id, Ewma(1.0))
            e.update_low(implied, self._alpha, e.value)
        self._row_changed(w.worker_id)

    def observe_ttft(self, route: Route, predicted_ms: float, observed_ms: float, clean: bool = False,
                     carried_ms: float | None = None) -> None:
        """Fold the TTFT residual into the route's fixed overhead (never below 0):
        a plain EWMA step when `clean` (nothing queued ahead), else a low-expectile
        step, so that queueing the prediction missed barely moves it. `carried_ms`:
        the overhead the prediction included (default: the route's current one)."""
        if not (math.isfinite(predicted_ms) and math.isfinite(observed_ms)) or observed_ms <= 0:
            return
        e = self._overhead[route]
        x = max(0.0, (e.value if carried_ms is None else carried_ms) + observed_ms - predicted_ms)
        if clean:
            e.update(x, self._alpha)
        else:
            e.update_low(x, self._alpha, self._default_overhead[route])

    def observe_first_token(self, c: Candidate, observed_ms: float, carried: float | None = None) -> None:
        """A request priced as `c` saw its first token after `observed_ms`.

        Split route (the client's token 0, the prefill's): the residual goes to the
        route's overhead (the prefill has its own timed correction); clean when P's
        queue was small.
        Colocated route: the worker reports no prefill timing. When the predicted
        prefill does not dominate (< PREFILL_DOMINANT x `fixed_cost_scale_ms`), the
        residual goes to the colocated overhead. Otherwise, when W's predicted queue
        was small, the TTFT less the overhead is a prefill sample of W (how W's
        calibration gets corrected at all)."""
        clean = c.queue_ms <= CLEAN_QUEUE_SHARE * c.prefill_ms
        if c.route is Route.DISAGGREGATED or c.prefill_ms < PREFILL_DOMINANT * self.fixed_cost_scale_ms():
            self.observe_ttft(c.route, c.ttft_ms, observed_ms, clean, c.overhead_ms)
            return
        if not (clean and math.isfinite(observed_ms) and observed_ms > 0 and c.prefill_ms > 0 and c.compute_tokens > 0):
            return
        r = ratio(observed_ms - c.overhead_ms - c.queue_ms, c.prefill_ms)
        if r is None:
            return
        sized = self._prefill.setdefault(c.decode.worker_id, Sized())
        # c.prefill_ms carried W's factor of this size at decision time (`carried`): compose with that.
        f = sized.factor(c.compute_tokens) if carried is None else carried
        sized.update(c.compute_tokens, min(CLAMP, max(1 / CLAMP, r * f)), self._alpha)
        self._prefill_at[c.decode.worker_id] = self._clock()
        self._row_changed(c.decode.worker_id)

    def observe_handoff(self, c: Candidate, lag_ms: float) -> None:
        """A split request priced as `c` saw its decode's token 0 `lag_ms` after the
        prefill's: the part beyond c's transfer and admission is a sample of the hand-off
        lag (a plain EWMA step: nothing queues between the two tokens but the admission,
        which `c` priced)."""
        if c.route is not Route.DISAGGREGATED or not math.isfinite(lag_ms) or lag_ms < 0:
            return
        self._lag.update(max(0.0, lag_ms - c.transfer_ms - c.admission_ms), self._alpha)

    def _row_changed(self, worker_id: str) -> None:
        """A correction `worker_id`'s cost row carries changed: its cached rows are stale."""
        self._row_version[worker_id] = self._row_version.get(worker_id, 0) + 1

    def _update(self, table: dict, key, ratio: float | None) -> None:
        if ratio is None:
            return
        e = table.get(key)
        if e is None:
            table[key] = e = Ewma(1.0)
        e.update(ratio, self._alpha)

    def corrections(self) -> dict[str, float]:
        """Current factors and overheads, for logs and tests (sized ones: their overall factor)."""
        out = {f"prefill/{k}": v.overall.value for k, v in self._prefill.items()}
        out.update({f"decode/{k}": v.value for k, v in self._decode.items()})
        out.update({f"transfer/{a}->{b}": v.overall.value for (a, b), v in self._path.items()})
        out.update({f"overhead/{r.name.lower()}": v.value for r, v in self._overhead.items()})
        out["handoff_lag"] = self._lag.value
        return out
