"""The drills: a rollback, or a promotion, under load, checked end to end.

Rollback drill, in this order:
    1. load starts (seeded prompts, no mode: the release decides each route)
    2. wait `trigger_after_s`, and until some requests completed disaggregated
    3. rollback, as the operator, waiting for every step (`Client.rollback`)
    4. the deployment records the release (`DrillCluster.record_release`)
    5. the decode workers are replaced, one at a time, load still running
    6. load stops once `duration_s` passed (and waits for what is in flight)
    7. checks: failures, tokens against colocated re-runs, publications under the
       retired epoch, blocks reserved and transactions open, steps, replacements

Promotion drill: load, then one promotion at a time up to ACTIVE (from a completed
rollback: PINNED first), each through the router's gates; a refusal ends the promotions
and fails the drill with the router's verdicts; then the same load checks. What its
options leave to the router (`for_router`) comes from the router's release status: the
samples its canary gates need, and load targets where it sets none.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace

from pdserve_client import contract
from pdserve_client.release import ReleaseView
from pdserve_client.types import PdError
from pdserve_ops.drill import checks
from pdserve_ops.drill.cluster import DrillCluster, DrillError
from pdserve_ops.drill.load import Load, compare_colocated
from pdserve_ops.drill.report import DecodeRollback, DrillReport, GateVerdict, Promotion, Replacement, StepTiming

DECODE_ROLES = ("decode", "mixed")
"""Directory roles of the workers the decode roll-back replaces."""
PROMOTION_ORDER = tuple(m for m in contract.RELEASE_MODES if m != "rolled_back")
FIRST_ERRORS = 5
"""Failures and mismatches the report lists one by one (it counts them all)."""
CANARY_SAMPLES = 20
"""The canary samples a router that does not say (an older build) needs: its default
PD_CANARY_MIN_SAMPLES (router/config.py)."""
FALLBACK_SLO_MS = {"slo_ttft_ms": 10_000.0, "slo_tpot_ms": 1_000.0}
"""The targets the promotion drill's load carries where neither the operator nor the router
gives one: a ceiling every request of a healthy cluster meets on either route, so that the
attainment gates can compare the routes (a route that stalls past it fails them); not an
SLO. Give yours (--slo-ttft-ms, --slo-tpot-ms) for a verdict on it."""


@dataclass(frozen=True, slots=True)
class DrillOptions:
    """How a drill runs."""

    rate_rps: float = 5.0
    """Requests sent per second (open loop, up to `concurrency` in flight)."""
    duration_s: float = 20.0
    """The load runs at least this long, and until the decode roll-back ended."""
    trigger_after_s: float = 5.0
    """The rollback (or first promotion) starts this long after the load, at the earliest."""
    max_tokens: int = 16
    seed: int = 0
    """Seeds the prompts: the same seed sends the same requests."""
    concurrency: int = 4
    min_disaggregated: int = 5
    """The rollback waits for this many disaggregated completions (until `duration_s`;
    then it starts anyway and the check reports how many there were)."""
    decode_timeout_s: float = 300.0
    """Budget of the whole decode roll-back."""
    settle_s: float = 15.0
    """How long blocks and transactions may take to reach 0 once the load stopped."""
    drain_s: float = 120.0
    """How long the requests in flight may take to end once the load stopped."""
    canary_fraction: float = 0.25
    """The promotion drill's canary share."""
    step_dwell_s: float = 1.0
    """The promotion drill's pause in each state, so the load meets it."""
    canary_samples: int | None = None
    """The promotion drill stays in CANARY until the load completed this many requests on
    each route since it began, or `canary_timeout_s` passed (None: what the router's canary
    gates judge on, its PD_CANARY_MIN_SAMPLES)."""
    canary_timeout_s: float = 180.0
    slo_ttft_ms: float | None = None
    """TTFT target each load request carries (0: none, the router's configured targets
    apply): the canary's attainment gates judge requests with targets only. None: the
    router's where it has one, else FALLBACK_SLO_MS's."""
    slo_tpot_ms: float | None = None
    reason: str = ""
    """For the release history (default: what the drill is)."""

    def __post_init__(self):
        positive = {"rate_rps": self.rate_rps, "duration_s": self.duration_s, "max_tokens": self.max_tokens,
                    "concurrency": self.concurrency, "decode_timeout_s": self.decode_timeout_s}
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        for name in ("trigger_after_s", "min_disaggregated", "settle_s", "drain_s", "step_dwell_s",
                     "canary_samples", "canary_timeout_s", "slo_ttft_ms", "slo_tpot_ms"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.trigger_after_s > self.duration_s:
            raise ValueError(f"trigger_after_s ({self.trigger_after_s:g}) must not exceed duration_s "
                             f"({self.duration_s:g}): the rollback must happen under load")
        if not 0.0 <= self.canary_fraction <= 1.0:
            raise ValueError(f"canary_fraction must be in [0, 1], got {self.canary_fraction}")


def rollback_drill(cluster: DrillCluster, options: DrillOptions | None = None) -> DrillReport:
    """Roll the release back under load and check what the module docstring lists."""
    options = options or DrillOptions()
    report = DrillReport("rollback", cluster.name, asdict(options))
    with cluster.client("client") as sdk, cluster.client("operator") as ops:
        before = ops.release()
        if before.mode == "rolled_back":
            raise DrillError("the release is ROLLED_BACK already: a rollback drill needs one to roll back "
                             "(promote it first: pdctl drill promote)")
        report.release_before = before.mode
        decode_before = {w.worker_id: w for w in cluster.registered() if w.role in DECODE_ROLES}
        load = Load(sdk, options.rate_rps, options.concurrency, options.max_tokens, options.seed,
                    options.slo_ttft_ms or 0.0, options.slo_tpot_ms or 0.0)
        load.start()
        try:
            trigger_s = _wait_for_trigger(load, options, "disaggregated", options.min_disaggregated)
            report.disaggregated_before = load.done("disaggregated", before_s=trigger_s)
            view, error = _roll_back(ops, options.reason or "drill: rollback under load")
            if view is not None:
                cluster.record_release(view)
            report.decode = _roll_back_decode(cluster, decode_before, options.decode_timeout_s)
            _sleep_until(load.started_s + options.duration_s)
        except BaseException:
            load.abort()
            raise
        _finish_load(report, load, sdk, options)
        report.release_after = _mode_now(ops)
    if view is not None and view.rollback is not None:
        report.rollback_ms = view.rollback.duration_ms
        report.steps = [StepTiming(s.step, s.duration_ms, s.started_unix_ms, s.ended_unix_ms, dict(s.counts),
                                   s.detail) for s in view.rollback.steps]
        complete = [s for s in view.rollback.steps if s.step == "ROLLBACK_COMPLETE" and s.ended_unix_ms]
        report.publications_under_old_epoch = complete[0].counts.get(checks.PUBLICATIONS_KEY) if complete else None
    report.checks = [
        checks.requests_failed(report),
        checks.disaggregated_before(report, "the rollback"),
        checks.tokens_equal_colocated(report),
        checks.publications_under_old_epoch(report),
        *checks.leftovers(report, options.settle_s),
        checks.rollback_complete(report, view, error),
        checks.decode_replaced(report.decode, {w: r.epoch for w, r in decode_before.items()}),
    ]
    return report


def promote_drill(cluster: DrillCluster, options: DrillOptions | None = None) -> DrillReport:
    """Promote the release one state at a time to ACTIVE under load, through the gates."""
    options = options or DrillOptions()
    with cluster.client("client") as sdk, cluster.client("operator") as ops:
        view = ops.release()
        path = promotion_path(view)
        options = for_router(options, sdk.release())  # the load's tenant: the targets it gets
        report = DrillReport("promote", cluster.name, asdict(options))
        report.release_before = view.mode
        load = Load(sdk, options.rate_rps, options.concurrency, options.max_tokens, options.seed,
                    options.slo_ttft_ms, options.slo_tpot_ms)
        load.start()
        try:
            trigger_s = _wait_for_trigger(load, options, None, 1)
            report.disaggregated_before = load.done("disaggregated", before_s=trigger_s)
            view = _promote(ops, view, path, options, report, load)
            cluster.record_release(view)
            _sleep_until(load.started_s + options.duration_s)
        except BaseException:
            load.abort()
            raise
        _finish_load(report, load, sdk, options)
        report.release_after = _mode_now(ops)
    report.checks = [
        checks.requests_failed(report),
        checks.tokens_equal_colocated(report),
        checks.promoted_to(report, "active"),
        *checks.leftovers(report, options.settle_s),
    ]
    return report


def for_router(options: DrillOptions, view: ReleaseView) -> DrillOptions:
    """`options` with what they leave to the router (None) filled in from its release
    status `view`, as the load's tenant sees it: the canary samples its gates judge on, and
    for each clock the router gives no target, FALLBACK_SLO_MS's (0 where it gives one: the
    load then carries none and the router's applies)."""
    routers = {"slo_ttft_ms": view.canary_slo_ttft_ms, "slo_tpot_ms": view.canary_slo_tpot_ms}
    targets = {name: (0.0 if routers[name] else FALLBACK_SLO_MS[name]) if getattr(options, name) is None
               else getattr(options, name) for name in FALLBACK_SLO_MS}
    samples = options.canary_samples if options.canary_samples is not None else \
        view.canary_min_samples or CANARY_SAMPLES
    return replace(options, canary_samples=samples, **targets)


def promotion_path(view: ReleaseView) -> list[str]:
    """The promotions from `view`'s state to ACTIVE, in order; DrillError when there are none."""
    if view.mode == "rolled_back":
        if view.rollback is None or not view.rollback.complete:
            raise DrillError("a rollback is in progress: finish it first (pdctl release rollback), then promote")
        return list(PROMOTION_ORDER)
    if view.mode == "active":
        raise DrillError("the release is ACTIVE already: nothing to promote (roll it back first: "
                         "pdctl drill rollback)")
    return list(PROMOTION_ORDER[PROMOTION_ORDER.index(view.mode) + 1:])


def failed_gates(message: str) -> list[GateVerdict]:
    """The failed gates a promotion refusal names: `promotion to X refused: n of m gates
    failed: NAME FAILED (measured vs threshold): detail; NAME FAILED: detail`. Must match
    GatesFailed's message (router/release/controller.py) and Check.line (router/release/gates.py)."""
    _, found, tail = message.partition("gates failed: ")
    if not found:
        return []
    verdicts = []
    for part in re.split(r"; (?=\w+ FAILED\b)", tail):
        m = re.match(r"(\w+) FAILED(?: \([^)]*\))?: (.*)", part, re.S)
        if m:
            verdicts.append(GateVerdict(m.group(1), False, m.group(2)))
    return verdicts


def _promote(ops, view: ReleaseView, path: list[str], options: DrillOptions, report: DrillReport,
             load: Load) -> ReleaseView:
    """Promote along `path`, one state at a time; a refusal ends it. Returns the release then."""
    reason = options.reason or "drill: promotion under load"
    for target in path:
        t0 = time.monotonic()
        try:
            change = ops.promote(target, canary_fraction=options.canary_fraction if target == "canary" else 0.0,
                                 reason=reason)
        except PdError as exc:
            report.promotions.append(Promotion(view.mode, target, False, round(time.monotonic() - t0, 3),
                                               failed_gates(exc.message), f"{exc.code}: {exc.message}"))
            try:
                return ops.release()
            except PdError:
                return view
        report.promotions.append(Promotion(change.previous_mode, change.release.mode, True,
                                           round(time.monotonic() - t0, 3),
                                           [GateVerdict(g.name, g.passed, g.detail) for g in change.gates]))
        view = change.release
        time.sleep(options.step_dwell_s)
        if view.mode == "canary":
            _canary_samples(load, options)
    return view


def _canary_samples(load: Load, options: DrillOptions) -> None:
    """Wait until the load completed `canary_samples` requests on each route since now (or
    `canary_timeout_s`; or a request failed: the drill has failed then): the router judges
    the canary on what it served."""
    since, give_up = time.monotonic(), time.monotonic() + options.canary_timeout_s
    while time.monotonic() < give_up and not load.failed(after_s=since) and min(
            load.done(route, after_s=since) for route in ("disaggregated", "colocated")) < options.canary_samples:
        time.sleep(0.2)


def _mode_now(ops) -> str:
    """The release's state now ("" when the router does not answer: the report still prints)."""
    try:
        return ops.release().mode
    except PdError:
        return ""


def _sleep_until(t_s: float) -> None:
    time.sleep(max(0.0, t_s - time.monotonic()))


def _wait_for_trigger(load: Load, options: DrillOptions, route: str | None, minimum: int) -> float:
    """Wait `trigger_after_s`, then for `minimum` completions on `route` (any if None), but
    no later than the load's `duration_s`; returns when (time.monotonic())."""
    earliest, latest = load.started_s + options.trigger_after_s, load.started_s + options.duration_s
    while time.monotonic() < earliest or (load.done(route) < minimum and time.monotonic() < latest):
        time.sleep(0.05)
    return time.monotonic()


def _roll_back(ops, reason: str) -> tuple[ReleaseView | None, str]:
    """Run the rollback to its end; (the release as it is then, why it stopped short or "")."""
    try:
        return ops.rollback(reason=reason, wait=True).release, ""
    except PdError as exc:
        error = f"the rollback stopped: {exc.code}: {exc.message}"
    try:
        return ops.release(), error
    except PdError as exc:
        return None, f"{error}; the release could not be read: {exc.code}: {exc.message}"


def _roll_back_decode(cluster: DrillCluster, before: dict, timeout_s: float) -> DecodeRollback:
    t0 = time.monotonic()
    try:
        fresh, error = cluster.roll_back_decode(timeout_s), ""
    except DrillError as exc:
        error = str(exc)
        try:  # what was replaced before it stopped
            fresh = [w for w in cluster.registered() if w.worker_id in before]
        except PdError:
            fresh = []
    seconds = time.monotonic() - t0
    replaced = [Replacement(w.worker_id, w.role, before[w.worker_id].epoch if w.worker_id in before else 0, w.epoch)
                for w in fresh if w.worker_id not in before or w.epoch > before[w.worker_id].epoch]
    return DecodeRollback(replaced, round(seconds, 3), error)


def _finish_load(report: DrillReport, load: Load, sdk, options: DrillOptions) -> None:
    """Stop the load, tally it, compare with colocated, read what is left reserved/open."""
    sent = load.stop(options.drain_s)
    ok = [s for s in sent if s.result is not None]
    bad = [s for s in sent if s.result is None]
    report.sent, report.succeeded, report.failed = len(sent), len(ok), len(bad)
    report.errors = [f"{s.request_id}: {s.error}" for s in bad[:FIRST_ERRORS]]
    report.routes = dict(Counter(s.result.route for s in ok))
    report.load_s = round(max((s.done_at_s for s in sent), default=load.started_s) - load.started_s, 3)
    comparison = compare_colocated(sdk, sent, options.max_tokens, options.concurrency)
    report.compared, report.mismatch_count = comparison.compared, len(comparison.mismatches)
    report.mismatches = comparison.mismatches[:FIRST_ERRORS]
    report.reserved_blocks_after, report.open_transactions_after = _settled(sdk, options.settle_s)


def _settled(sdk, settle_s: float) -> tuple[int | None, int | None]:
    """(reserved blocks, open transactions) once both are 0, or as they are after `settle_s`:
    workers report their load every few hundred ms, so a figure may lag the load's end."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            s = sdk.status()
        except PdError:
            return None, None
        if (s.reserved_blocks == 0 and s.open_transactions == 0) or time.monotonic() > deadline:
            return s.reserved_blocks, s.open_transactions
        time.sleep(0.25)


