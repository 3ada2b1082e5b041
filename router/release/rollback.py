"""The rollback's steps in order (docs/design.md, The release), each recorded in the release record
as it starts and as it ends (time, counts), so that a router that dies mid-rollback leaves
a record the next router resumes from the first step not ended. Every step is safe to run
again: it checks what already holds before acting.

    STOP_NEW_ROUTES            the write that enters ROLLED_BACK (controller.py): the
                               directory refuses transfer reservations from then on
    ADVANCE_ROUTE_EPOCH        retire the epoch: nothing reserved under it publishes,
                               no capability minted under it is honoured
    DRAIN_OR_ABORT_TRANSFERS   wait for unpublished transfers to end (refused at their
                               next move), abort what is left after the drain timeout
    ENABLE_COLOCATED_FALLBACK  a colocated request served end to end, now
    DISABLE_CONNECTOR          the directory's route stop verified in place
    REVOKE_CAPABILITIES        the epoch moved on and no transfer of the old one is open
    RECLAIM_UNPUBLISHED        every worker's reserved blocks are back in its pool
    ROLLBACK_COMPLETE          the completion gate (gates.py `rollback_complete`)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from router.release.gates import completion_gate
from router.release.probes import RollbackBlocked, colocated_probe, open_transfers, reserved_blocks
from runtime.release.machine import RollbackStep
from runtime.release.record import StepRecord
from runtime.telemetry import tracing

log = logging.getLogger(__name__)

POLL_S = 0.1


@dataclasses.dataclass
class Step:
    """What a step function reports: counts and a line of detail."""

    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    detail: str = ""


async def run_steps(ctl) -> None:
    """Run the record's remaining steps in order (the controller's rollback task)."""
    try:
        while (step := ctl.record.rollback.next_step()) is not None:
            await _take(ctl, step)
            await asyncio.sleep(ctl.config.rollback_step_pause_s)
        rb = ctl.record.rollback
        ctl.orch.metrics.rollback.labels(step="total").observe(rb.duration_ms / 1000)
        log.warning("rollback complete in %d ms (from %s)", rb.duration_ms, rb.from_state.name)
    except RollbackBlocked as exc:
        log.error("rollback stopped at %s: %s (it resumes on the next `pdctl release rollback`)",
                  ctl.record.rollback.next_step().name, exc)
        raise


async def _take(ctl, step: RollbackStep) -> None:
    rb = ctl.record.rollback
    begun = rb.step(step)
    start_ms = begun.started_ms if begun is not None else ctl.now_ms()
    changes = {"retired_epoch": ctl.orch.view.route_epoch} if step is RollbackStep.ADVANCE_ROUTE_EPOCH \
        and not rb.retired_epoch else {}
    await _record(ctl, StepRecord(step, start_ms, detail="running"), **changes)
    t0 = time.monotonic()
    with tracing.span_in(f"release.rollback.{step.name.lower()}", attributes={"pd.rollback_step": step.name}):
        try:
            done = await STEPS[step](ctl)
        except RollbackBlocked as exc:
            await _record(ctl, StepRecord(step, start_ms, detail=f"blocked: {exc}"))
            raise
    ctl.orch.metrics.rollback.labels(step=step.name).observe(time.monotonic() - t0)
    await _record(ctl, StepRecord(step, start_ms, ctl.now_ms(), done.counts, done.detail))
    log.info("rollback step %s done: %s %s", step.name, done.counts, done.detail)


async def _record(ctl, record: StepRecord, **changes) -> None:
    """Write the step's record, renewing this router's lease on the rollback."""
    rb = ctl.record.rollback.with_step(record)
    rb = dataclasses.replace(rb, owner=ctl.router_id,
                             owner_until_ms=ctl.now_ms() + int(ctl.config.rollback_lease_s * 1000), **changes)
    await ctl.write(ctl.record.next_version(rollback=rb))


# ---- the steps -----------------------------------------------------------------


def stop_routes_here(ctl) -> Step:
    """STOP_NEW_ROUTES on this router (new requests colocated at once) and what it records:
    the one builder of the step, for the write that enters ROLLED_BACK (controller.py)
    and for `stop_new_routes`."""
    ctl.orch.view.routes_stopped = True
    return Step({"requests_in_flight": ctl.orch.in_flight},
                "new requests run colocated; the directory refuses transfer reservations")


async def stop_new_routes(ctl) -> Step:
    return stop_routes_here(ctl)  # recorded with the write entering ROLLED_BACK; here only if that was lost


async def advance_route_epoch(ctl) -> Step:
    retired = ctl.record.rollback.retired_epoch
    epoch = await ctl.orch.directory.advance_route_epoch(retired, "rollback", ctl.config.directory_timeout_s)
    if epoch.route_epoch <= retired:
        raise RollbackBlocked(f"the route epoch did not move past {retired}")
    if not epoch.advanced:  # an earlier run of this step advanced it, then died: count now
        published = await ctl.orch.directory.publications(retired, ctl.config.directory_timeout_s)
    else:
        published = epoch.publications
    await ctl.orch.view.get(max_age_s=0.0)
    return Step({"retired_epoch": retired, "route_epoch": epoch.route_epoch, "publications_at_retirement": published})


async def drain_or_abort(ctl) -> Step:
    cfg, gauge = ctl.config, ctl.orch.metrics.drain_depth
    first = await open_transfers(ctl)
    give_up = time.monotonic() + cfg.rollback_drain_timeout_s
    left = first
    while left and time.monotonic() < give_up:
        gauge.set(len(left))
        await asyncio.sleep(POLL_S)
        left = await open_transfers(ctl)
    for t in left:  # past the drain timeout: abort (the workers free the blocks once their transport is quiet)
        await ctl.orch.directory.abort_txn(t.request_id, t.transfer_id, t.generation, "rollback: drain timeout",
                                           cfg.directory_timeout_s)
    gauge.set(len(await open_transfers(ctl)))
    return Step({"open_at_start": len(first), "ended_on_their_own": len(first) - len(left),
                 "aborted": len(left)})


async def enable_colocated_fallback(ctl) -> Step:
    cluster = await ctl.orch.view.get(max_age_s=0.0)
    serving = [w for w in cluster.workers if w.can_decode]
    if not serving:
        raise RollbackBlocked("no live worker can serve colocated requests")
    ttft_ms = await colocated_probe(ctl)
    return Step({"colocated_workers": len(serving), "probe_ttft_us": int(ttft_ms * 1000)},
                "a colocated request was served end to end")


async def disable_connector(ctl) -> Step:
    give_up = time.monotonic() + ctl.config.rollback_connector_timeout_s
    while True:
        cluster = await ctl.orch.view.get(max_age_s=0.0)
        if not cluster.release.routes_stopped:
            raise RollbackBlocked("the directory does not report new routes stopped")
        on = sorted(w.worker_id for w in cluster.workers if not w.load.connector_disabled)
        if not on:
            return Step({"workers": len(cluster.workers)}, "the directory refuses transfer reservations "
                        "(ROUTES_STOPPED) and every live worker refuses transfer work")
        if time.monotonic() > give_up:
            raise RollbackBlocked(f"{', '.join(on)} still report their connector on")
        await asyncio.sleep(POLL_S)


async def revoke_capabilities(ctl) -> Step:
    cluster = await ctl.orch.view.get(max_age_s=0.0)
    retired = ctl.record.rollback.retired_epoch
    if cluster.route_epoch <= retired:
        raise RollbackBlocked(f"route epoch {cluster.route_epoch} is not past the retired {retired}")
    still = await open_transfers(ctl)
    if still:
        raise RollbackBlocked(f"{len(still)} transfers of the retired epoch are still open")
    return Step({"retired_epoch": retired, "route_epoch": cluster.route_epoch},
                "capabilities carry their route epoch; the directory refuses their nonces under another")


async def reclaim_unpublished(ctl) -> Step:
    first = await reserved_blocks(ctl)
    give_up = time.monotonic() + ctl.config.rollback_reclaim_timeout_s
    left = first
    while left and time.monotonic() < give_up:
        await asyncio.sleep(POLL_S)
        left = await reserved_blocks(ctl)
    if left:
        raise RollbackBlocked(f"{left} blocks of unpublished transfers are still reserved")
    return Step({"blocks_reclaimed": first})


async def rollback_complete(ctl) -> Step:
    checks = await completion_gate(ctl)
    failed = [c for c in checks if not c.passed]
    if failed:
        raise RollbackBlocked("; ".join(f"{c.name}: {c.detail}" for c in failed))
    late = next(c for c in checks if c.name == "no_publication_under_the_retired_epoch_since")
    return Step({"conditions": len(checks), "publications_under_retired_epoch": int(late.measured)},
                "every completion condition holds")


STEPS = {
    RollbackStep.STOP_NEW_ROUTES: stop_new_routes,
    RollbackStep.ADVANCE_ROUTE_EPOCH: advance_route_epoch,
    RollbackStep.DRAIN_OR_ABORT_TRANSFERS: drain_or_abort,
    RollbackStep.ENABLE_COLOCATED_FALLBACK: enable_colocated_fallback,
    RollbackStep.DISABLE_CONNECTOR: disable_connector,
    RollbackStep.REVOKE_CAPABILITIES: revoke_capabilities,
    RollbackStep.RECLAIM_UNPUBLISHED: reclaim_unpublished,
    RollbackStep.ROLLBACK_COMPLETE: rollback_complete,
}
assert tuple(STEPS) == tuple(RollbackStep), "a function per step, in order"

