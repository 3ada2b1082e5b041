"""This router's part in the release (docs/design.md, The release): every replica follows the record the
directory keeps; the one an operator asks (Admin) moves it.

Following: every `release_poll_s` (and whenever a snapshot shows a new version) the
router reads the record and applies it — the default mode of requests that name none
(`ROUTER_MODE`), the canary share, and whether new disaggregated routes are stopped.
A cluster with no record yet gets one from the first router that sees a worker: the
state of its configured mode, with the deployment manifest frozen from what is live.

Reporting: `manifest_drift` says where the live cluster is not the frozen manifest (a
record kept from an earlier deployment: another model, tokenizer or cache ABI), and every
refusal names the state the release stays in and the commands that move it (`moves`).

Moving: `promote` takes one legal step through its gates (router/release/gates.py);
`rollback` enters ROLLED_BACK — that write is STOP_NEW_ROUTES, cluster-wide at once,
because the directory refuses transfer reservations from then on — and runs the
remaining steps (router/release/rollback.py). A rollback whose runner died is resumed
by whichever router next finds its lease lapsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from router.config import RouterConfig
from router.release.canary import CanaryTally
from router.release.gates import Check
from router.release.gates import summary as gates_summary
from router.release.manifest import drift, freeze
from router.release.promotion import promotion_gates
from router.release.rollback import run_steps, stop_routes_here
from router.types import RouterError, StatusCode, WorkerCallError
from runtime.directory.states import Outcome
from runtime.release.machine import (
    RELEASE_OF_MODE,
    ROUTER_MODE,
    IllegalTransition,
    Release,
    RollbackStep,
    check_transition,
    next_promotion,
)
from runtime.release.record import ReleaseRecord, Rollback, StepRecord

log = logging.getLogger(__name__)


class ReleaseConflict(RuntimeError):
    """Another router wrote the release first; the record was read again (try again)."""


class GatesFailed(RuntimeError):
    """A promotion's gates did not all pass; `checks` has every verdict."""

    def __init__(self, current: Release, target: Release, checks: list[Check]):
        failed = [c for c in checks if not c.passed]
        # "gates failed: " and what follows is read back by the drill (ops/pdserve_ops/drill/run.py).
        super().__init__(f"promotion to {target.name} refused (the release stays {current.name}; "
                         f"`pdctl release promote --reason R` again once these pass): {len(failed)} of "
                         f"{len(checks)} gates failed: " + "; ".join(c.line() for c in failed))
        self.checks = checks


def moves(record: ReleaseRecord) -> str:
    """The release's state and the pdctl commands that move it from there: what a refusal
    adds, so that it never leaves an operator guessing."""
    state = record.state
    if record.rolling_back:
        return f"the release is {state.name}, its rollback unfinished: `pdctl release rollback --reason R` resumes it"
    step = Release.PINNED if state is Release.ROLLED_BACK else next_promotion(state)
    ways = [f"`pdctl release promote --reason R` moves it to {step.name}" if step is not None else "",
            "" if state is Release.ROLLED_BACK else "`pdctl release rollback --reason R` rolls it back"]
    return f"the release is {state.name}: " + " or ".join(w for w in ways if w)


def now_ms() -> int:
    """Wall clock, Unix ms: the times a release record carries (leases are judged on it
    too: routers' clocks are assumed NTP-close, well within `rollback_lease_s`)."""
    return int(time.time() * 1000)


class ReleaseController:
    """Follows and moves the release record for one router (see the module docstring)."""

    def __init__(self, orch, router_id: str, config: RouterConfig, tokenizer_identity: str = ""):
        self._orch = orch
        self.router_id = router_id
        self._cfg = config
        self.tokenizer_identity = tokenizer_identity
        self.configured_mode = orch.default_mode
        self.record: ReleaseRecord | None = None
        self.runner: asyncio.Task | None = None
        self._follower: asyncio.Task | None = None
        self._writes = asyncio.Lock()
        self.canary = CanaryTally()
        """What this router served, by route and time: the canary's record (router/release/canary.py)."""
        orch.metrics.listeners.append(self.canary)

    @property
    def orch(self):
        return self._orch

    @property
    def config(self) -> RouterConfig:
        return self._cfg

    @staticmethod
    def now_ms() -> int:
        return now_ms()

    # ---- following ------------------------------------------------------------

    def start(self) -> None:
        """Follow the record in the background until `close`."""
        self._follower = asyncio.create_task(self._follow_forever(), name="release follower")

    async def close(self) -> None:
        """Stop following; a rollback this router runs stops between its steps' awaits
        (its lease lapses, and a router that is still up resumes it)."""
        for task in (self._follower, self.runner):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _follow_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except (RouterError, WorkerCallError) as exc:
                log.debug("release: cannot read the record now: %s", exc)
            await asyncio.sleep(self._cfg.release_poll_s)

    async def refresh(self, force: bool = False) -> ReleaseRecord | None:
        """Read the record if the latest snapshot shows another version (always with
        `force`), apply it, create it when the cluster has none, and resume a rollback
        nobody runs."""
        cluster = await self._orch.view.get(max_age_s=0.0 if force else None)
        known = self.record.version if self.record is not None else 0
        if force or cluster.release.version != known:
            # Read under the write lock: a read that left before one of our writes landed
            # and came back after it would put the older version back, and our next write
            # would expect it (the rollback drill stopped on "version 3, not 2" so).
            async with self._writes:
                self.apply(await self._orch.directory.get_release(self._cfg.directory_timeout_s))
        if self.record is None and any(w.can_decode for w in cluster.workers):
            await self._create(cluster)
        if self.record is not None and self.record.rolling_back and self._may_run(self.record.rollback):
            self.run_rollback()
        return self.record

    def apply(self, record: ReleaseRecord | None) -> None:
        """Serve as `record` says (the configured mode while there is none)."""
        self.record = record
        orch = self._orch
        if record is None:
            orch.default_mode, orch.view.routes_stopped = self.configured_mode, False
            return
        mode = self.mode_of(record.state)
        if orch.default_mode != mode:
            log.info("release %s (version %d): requests without a mode run %s", record.state.name, record.version,
                     mode)
        orch.default_mode = mode
        orch.planner.canary_fraction = record.canary_fraction
        orch.view.routes_stopped = record.routes_stopped

    def mode_of(self, state: Release) -> str:
        """The router mode of requests that name none in `state`: ACTIVE keeps the router's
        configured disaggregating mode (auto, or disaggregated forced), the others are fixed."""
        if state is Release.ACTIVE and self.configured_mode in ("auto", "disaggregated"):
            return self.configured_mode
        return ROUTER_MODE[state]

    async def _create(self, cluster) -> None:
        state = RELEASE_OF_MODE[self.configured_mode]
        record = ReleaseRecord(state, 1, freeze(cluster, self), self._orch.planner.canary_fraction)
        with contextlib.suppress(ReleaseConflict):  # another router created it first: follow that one
            await self.write(record)
            log.info("release record created: %s from the router's mode %s, manifest %s", state.name,
                     self.configured_mode, record.manifest_digest[:16])

    # ---- moving -----------------------------------------------------------------

    async def write(self, record: ReleaseRecord) -> ReleaseRecord:
        """Compare-and-set `record` (its version - 1 must be the stored one) and apply it.
        Raises ReleaseConflict (another writer came first) or IllegalTransition."""
        async with self._writes:
            answer = await self._orch.directory.write_release(record.version - 1, record,
                                                              self._cfg.directory_timeout_s)
            if answer.outcome is Outcome.APPLIED:
                self.apply(record)
                return record
            self.apply(answer.current)
            if answer.outcome is Outcome.ILLEGAL_TRANSITION:
                raise IllegalTransition(answer.message)
            raise ReleaseConflict(answer.message or "another router wrote the release first")

    async def current(self) -> ReleaseRecord:
        """The record read now (created first when the cluster has none)."""
        record = await self.refresh(force=True)
        if record is None:
            raise RouterError(StatusCode.UNAVAILABLE, "no release record yet: no decode-capable worker has registered")
        return record

    async def rollback(self, reason: str, by: str, wait: bool = True) -> ReleaseRecord:
        """Enter ROLLED_BACK (STOP_NEW_ROUTES) unless already there, then run the remaining
        steps; with `wait`, return once the last ended (or its runner failed)."""
        record = await self.current()
        if record.state is not Release.ROLLED_BACK:
            at = now_ms()
            stopped = stop_routes_here(self)  # this router first, before the write returns
            stop = StepRecord(RollbackStep.STOP_NEW_ROUTES, at, now_ms(), stopped.counts, stopped.detail)
            rollback = Rollback(record.state, at, reason, by, (stop,), owner=self.router_id,
                                owner_until_ms=at + int(self._cfg.rollback_lease_s * 1000))
            try:
                record = await self.write(record.moved(Release.ROLLED_BACK, at, by, reason, rollback=rollback))
            except BaseException:
                self._orch.view.routes_stopped = self.record is not None and self.record.routes_stopped
                raise
            log.warning("rollback of %s started by %s: %s", rollback.from_state.name, by, reason)
        elif record.rollback is not None and not self._may_run(record.rollback):
            raise ReleaseConflict(f"router {record.rollback.owner} runs this rollback (lease until "
                                  f"{record.rollback.owner_until_ms} ms)")
        task = self.run_rollback()
        if wait and task is not None:
            await asyncio.shield(task)  # the rollback goes on if the caller leaves
        return self.record

    async def promote(self, target: Release | None, reason: str, by: str,
                      canary_fraction: float = 0.0) -> tuple[Release, ReleaseRecord, list[Check]]:
        """Move one legal step (to `target`, default the next) through its gates. Raises
        IllegalTransition, or GatesFailed with every gate's verdict."""
        record = await self.current()
        complete = record.rollback is not None and record.rollback.complete
        target = target or (Release.PINNED if record.state is Release.ROLLED_BACK else next_promotion(record.state))
        if target is None:
            raise IllegalTransition(f"{record.state.name} has no promotion (ACTIVE is the last state); "
                                    f"{moves(record)}")
        if target is Release.ROLLED_BACK:
            raise IllegalTransition("a rollback is not a promotion: `pdctl release rollback --reason R`")
        try:
            check_transition(record.state, target, complete)
        except IllegalTransition as exc:
            raise IllegalTransition(f"{exc}; {moves(record)}") from None
        checks = await promotion_gates(self, target)
        if not all(c.passed for c in checks):
            raise GatesFailed(record.state, target, checks)
        changes: dict = {}
        if target is Release.PINNED:
            changes["manifest"] = freeze(await self._orch.view.get(max_age_s=0.0), self)
        if canary_fraction:
            changes["canary_fraction"] = canary_fraction
        new = record.moved(target, now_ms(), by, reason, gates_summary(checks), **changes)
        log.warning("release %s -> %s by %s: %s", record.state.name, target.name, by, reason)
        return record.state, await self.write(new), checks

    async def manifest_drift(self) -> list[str]:
        """Where the live cluster is not the record's frozen manifest ("field frozen ->
        live" each): a record kept from an earlier deployment. None while nothing was
        frozen, or while no worker is listed (nothing live to compare)."""
        frozen = self.record.manifest if self.record is not None else None
        cluster = await self._orch.view.get(max_age_s=0.0)
        if frozen is None or not cluster.workers:
            return []
        return drift(frozen, freeze(cluster, self))

    def _may_run(self, rollback: Rollback) -> bool:
        return rollback.owner == self.router_id or rollback.owner_until_ms < now_ms()

    def run_rollback(self) -> asyncio.Task | None:
        """The task running the record's remaining rollback steps (started if none runs)."""
        if self.record is None or not self.record.rolling_back:
            return self.runner if self.runner is not None and not self.runner.done() else None
        if self.runner is None or self.runner.done():
            self.runner = asyncio.create_task(run_steps(self), name="rollback")
        return self.runner

