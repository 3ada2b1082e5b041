"""The drills' checks: each judges one figure of a `DrillReport` against its target.

A figure the cluster did not report is NOT MEASURED and fails its check: a drill never
passes on a figure it did not see.
"""

from __future__ import annotations

from pdserve_client.release import ReleaseView
from pdserve_client.rpc.pd.v1 import release_pb2
from pdserve_ops.drill.report import NOT_MEASURED, Check, DecodeRollback, DrillReport

EXPECTED_STEPS = tuple(name.removeprefix("ROLLBACK_STEP_") for name, number in
                       sorted(release_pb2.RollbackStep.items(), key=lambda item: item[1]) if number)
"""The rollback's steps in the order they must run (pd.v1.RollbackStep's order)."""

PUBLICATIONS_KEY = "publications_under_retired_epoch"
"""Count the router records in ROLLBACK_COMPLETE's step: transfers published under the
retired route epoch after it was retired. Must match the router's ROLLBACK_COMPLETE counts
(router/release/rollback.py)."""


def requests_failed(r: DrillReport) -> Check:
    """No request of the load failed (and some were sent)."""
    if not r.sent:
        return Check("requests_failed", False, 0, "no request was sent: the drill proves nothing")
    return Check("requests_failed", r.failed == 0, r.failed, f"{r.failed} of {r.sent} requests failed (target 0)")


def disaggregated_before(r: DrillReport, what: str) -> Check:
    """Some requests ran disaggregated before `what` (else the rollback had nothing to undo)."""
    n = r.disaggregated_before
    return Check("disaggregated_before_rollback", n > 0, n,
                 f"{n} requests completed disaggregated before {what} (target > 0"
                 + ("" if n else ": without them the drill proves nothing") + ")")


def tokens_equal_colocated(r: DrillReport) -> Check:
    """Every succeeded request's tokens equal a colocated re-run's."""
    if not r.succeeded:
        return Check("tokens_equal_colocated", False, None, f"{NOT_MEASURED}: no request succeeded")
    passed = r.compared == r.succeeded and not r.mismatch_count
    return Check("tokens_equal_colocated", passed, r.mismatch_count,
                 f"{r.mismatch_count} of {r.compared} requests differ from colocated or could not be "
                 "re-run (target 0)")


def publications_under_old_epoch(r: DrillReport) -> Check:
    """Nothing was published under the retired route epoch (the router's own count)."""
    n = r.publications_under_old_epoch
    if n is None:
        return Check("publications_under_old_epoch", False, None,
                     f"{NOT_MEASURED}: the rollback record's ROLLBACK_COMPLETE counts have no {PUBLICATIONS_KEY}")
    return Check("publications_under_old_epoch", n == 0, n, f"{n} transfers published under the retired epoch "
                 "(target 0)")


def leftovers(r: DrillReport, settle_s: float) -> list[Check]:
    """Nothing reserved, nothing open, once the load ended (after at most `settle_s`)."""
    out = []
    for name, value, what in (("reserved_blocks_after", r.reserved_blocks_after, "K/V blocks reserved"),
                              ("open_transactions_after", r.open_transactions_after, "transfer transactions open")):
        if value is None:
            out.append(Check(name, False, None, f"{NOT_MEASURED}: Admin.Status did not answer"))
        else:
            out.append(Check(name, value == 0, value, f"{value} {what} after the load (target 0; waited up to "
                                                      f"{settle_s:g} s for it)"))
    return out


def rollback_complete(r: DrillReport, view: ReleaseView | None, error: str) -> Check:
    """The rollback ran every step, in order, to ROLLED_BACK."""
    rb = view.rollback if view is not None else None
    if rb is None:
        return Check("rollback_complete", False, None,
                     f"{NOT_MEASURED}: no rollback recorded{': ' + error if error else ''}")
    order = tuple(s.step for s in rb.steps)
    problems = [error] if error else []
    if order != EXPECTED_STEPS:
        problems.append(f"steps ran {', '.join(order) or 'none'}; expected {', '.join(EXPECTED_STEPS)}")
    if not rb.complete:
        ended = [s.step for s in rb.steps if s.ended_unix_ms]
        problems.append(f"not complete (last step ended: {ended[-1] if ended else 'none'})")
    if view.mode != "rolled_back":
        problems.append(f"release is {view.mode.upper()}, not ROLLED_BACK")
    return Check("rollback_complete", not problems, r.rollback_ms,
                 "; ".join(problems) or f"{len(order)} steps in order in {r.rollback_ms} ms, release ROLLED_BACK")


def decode_replaced(d: DecodeRollback, before: dict[str, int]) -> Check:
    """Every decode worker listed before the drill came back registered at a new epoch."""
    after = {p.worker_id: p.epoch_after for p in d.replacements}
    stale = sorted(w for w, epoch in before.items() if after.get(w, 0) <= epoch)
    problems = ([d.error] if d.error else []) + ([f"not replaced: {', '.join(stale)}"] if stale else [])
    if not before:
        problems.append("no decode worker was registered before the drill")
    return Check("decode_replaced", not problems, len(d.replacements),
                 "; ".join(problems) or f"{len(d.replacements)} decode workers replaced, each registered at a new "
                                        f"epoch, in {d.seconds:.1f} s")


def promoted_to(r: DrillReport, target: str) -> Check:
    """Every promotion passed its gates and the release reached `target`."""
    refused = [p for p in r.promotions if not p.passed]
    if refused:
        p = refused[0]
        failed = [g for g in p.gates if not g.passed]
        unmeasured = [g.name for g in failed if g.detail.startswith(("not measured", "not measurable"))]
        detail = (f"{p.from_mode.upper()} -> {p.to_mode.upper()} refused: "
                  + ("; ".join(f"{g.name}: {g.detail}" for g in failed) if failed else p.refusal))
        if unmeasured:
            detail += f" (gates that could not be measured: {', '.join(unmeasured)})"
        return Check(f"promoted_to_{target}", False, len(failed), detail)
    steps = " -> ".join([r.promotions[0].from_mode.upper(), *(p.to_mode.upper() for p in r.promotions)]) \
        if r.promotions else "no promotion"
    reached = r.release_after == target
    return Check(f"promoted_to_{target}", reached, 0,
                 f"{steps}, every gate passed" if reached else f"{steps}; release is {r.release_after.upper()}")
