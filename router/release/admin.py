"""The release's Admin RPCs (pdctl release status | promote | rollback, and SetMode), a
mixin of router/admin.py's servicer: proto -> ReleaseController -> proto.

ReleaseStatus adds what the record alone cannot say: where the live cluster has drifted
from the frozen manifest, and what the canary's gates need (samples, and the targets a
request of the caller's tenant gets), so that a drill's load can give it to them.

Refusals are FAILED_PRECONDITION with the reason (an illegal transition, which gates
failed and by how much, another router running the rollback); a rollback step that
cannot complete now is FAILED_PRECONDITION too, and the rollback resumes from it."""

from __future__ import annotations

import logging

import grpc

from pdserve_client.rpc.pd.v1 import admin_pb2
from router.identity import caller_tenant
from router.release.controller import GatesFailed, ReleaseConflict, ReleaseController
from router.release.gates import Check
from router.release.probes import RollbackBlocked
from router.types import RouterError, WorkerCallError
from runtime.release.machine import IllegalTransition, Release
from runtime.release.wire import record_to_pb
from runtime.security.tls import caller_name

log = logging.getLogger(__name__)


def gate_to_pb(c: Check) -> admin_pb2.GateResult:
    return admin_pb2.GateResult(name=c.name, passed=c.passed, measured=c.measured, threshold=c.threshold,
                                detail=c.detail)


def _target(mode: int) -> Release | None:
    return None if mode == admin_pb2.RELEASE_MODE_UNSPECIFIED else Release(mode)


class ReleaseAdmin:
    """ReleaseStatus, Promote, Rollback and SetMode over a ReleaseController (`self._release`)."""

    _release: ReleaseController
    _secure: bool

    async def _refuse(self, context, exc: Exception) -> None:
        if isinstance(exc, RouterError):
            await context.abort(grpc.StatusCode.UNAVAILABLE, exc.message)
        if isinstance(exc, WorkerCallError):
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"directory: {exc.code.name}: {exc.message}")
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    async def ReleaseStatus(self, request, context):
        try:
            record = await self._release.current()
        except (RouterError, WorkerCallError) as exc:
            await self._refuse(context, exc)
        try:
            drift = await self._release.manifest_drift()
        except (RouterError, WorkerCallError) as exc:
            await self._refuse(context, exc)
        orch = self._release.orch
        return admin_pb2.ReleaseStatusResponse(record=record_to_pb(record), router_mode=orch.default_mode,
                                               routes_stopped=orch.view.colocated_only,
                                               router_id=self._release.router_id, route_epoch=orch.view.route_epoch,
                                               manifest_drift="; ".join(drift), canary=self._canary_needs(context))

    def _canary_needs(self, context) -> admin_pb2.CanaryNeeds:
        cfg = self._release.config
        ttft_ms, tpot_ms = cfg.slo_for(caller_tenant(context, self._secure) or cfg.default_tenant)
        return admin_pb2.CanaryNeeds(min_samples=cfg.canary_min_samples, slo_ttft_ms=ttft_ms, slo_tpot_ms=tpot_ms)

    async def Promote(self, request, context):
        if not request.reason.strip():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "reason is required: the release history says why")
        if request.target not in admin_pb2.ReleaseMode.values():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"target {request.target} is not a release mode")
        if not 0.0 <= request.canary_fraction <= 1.0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"canary_fraction must be in [0, 1], got {request.canary_fraction}")
        try:
            previous, record, checks = await self._release.promote(
                _target(request.target), request.reason, caller_name(context), request.canary_fraction)
        except GatesFailed as exc:
            context.set_trailing_metadata((("pd-gates", "; ".join(c.line() for c in exc.checks)),))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except (IllegalTransition, ReleaseConflict, RouterError, WorkerCallError) as exc:
            await self._refuse(context, exc)
        return admin_pb2.ReleaseChange(previous_mode=int(previous), record=record_to_pb(record),
                                       gates=[gate_to_pb(c) for c in checks])

    async def Rollback(self, request, context):
        if not request.reason.strip():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "reason is required: the release history says why")
        before = self._release.record.state if self._release.record is not None else None
        try:
            record = await self._release.rollback(request.reason, caller_name(context), wait=request.wait)
        except (IllegalTransition, ReleaseConflict, RollbackBlocked, RouterError, WorkerCallError) as exc:
            await self._refuse(context, exc)
        previous = record.rollback.from_state if before is None or before is Release.ROLLED_BACK else before
        return admin_pb2.ReleaseChange(previous_mode=int(previous), record=record_to_pb(record))

    async def SetMode(self, request, context):
        if request.mode == admin_pb2.RELEASE_MODE_UNSPECIFIED:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "mode is required")
        if request.mode not in admin_pb2.ReleaseMode.values():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"mode {request.mode} is not a release mode")
        if request.mode == admin_pb2.RELEASE_MODE_ROLLED_BACK:
            change = await self.Rollback(admin_pb2.RollbackRequest(reason=request.reason, wait=True), context)
            steps = [f"{admin_pb2.RollbackStep.Name(s.step).removeprefix('ROLLBACK_STEP_')}"
                     for s in change.record.rollback.steps if s.ended_unix_ms]
        else:
            change = await self.Promote(admin_pb2.PromoteRequest(
                target=request.mode, canary_fraction=request.canary_fraction, reason=request.reason), context)
            steps = [f"GATE_{g.name.upper()}" for g in change.gates]
        return admin_pb2.SetModeResponse(previous_mode=change.previous_mode, mode=change.record.mode,
                                         route_epoch=self._release.orch.view.route_epoch, steps=steps)
