"""Admin servicer: cluster status, release mode, transaction listing, decisions, and
who holds which blocks (router/blocks.py).

Release modes (article 0x0FF) map onto router modes (router/requests/planner.py):
PINNED -> colocated, SHADOW -> shadow, CANARY -> canary (with canary_fraction),
ACTIVE -> auto (disaggregated wherever the router predicts it wins). Status
reports the release mode of the current router mode (the forced
``disaggregated`` mode reads as ACTIVE) and the exact name in router_mode.
ROLLED_BACK (with the 0x0FG rollback order) comes with the release state
machine and answers UNIMPLEMENTED until then.
"""

from __future__ import annotations

import logging

import grpc

from pdserve_client.rpc.pd.v1 import admin_pb2, admin_pb2_grpc
from router.blocks import blocks
from router.grpc_gateway import grpc_code
from router.identity import caller_tenant
from router.requests.admission import MAX_REQUEST_ID_BYTES
from router.requests.orchestrator import Orchestrator
from router.requests.records import DecisionRecord
from router.types import RouterError, WorkerCallError
from services.directory.wire import worker_record_to_pb
from services.security.tls import caller_name

log = logging.getLogger(__name__)

DEFAULT_LIST_LIMIT = 100

_RELEASE_OF_MODE = {"colocated": admin_pb2.RELEASE_MODE_PINNED, "shadow": admin_pb2.RELEASE_MODE_SHADOW,
                    "canary": admin_pb2.RELEASE_MODE_CANARY, "auto": admin_pb2.RELEASE_MODE_ACTIVE,
                    "disaggregated": admin_pb2.RELEASE_MODE_ACTIVE}
_MODE_OF_RELEASE = {admin_pb2.RELEASE_MODE_PINNED: "colocated", admin_pb2.RELEASE_MODE_SHADOW: "shadow",
                    admin_pb2.RELEASE_MODE_CANARY: "canary", admin_pb2.RELEASE_MODE_ACTIVE: "auto"}


def record_to_pb(r: DecisionRecord) -> admin_pb2.DecisionRecord:
    """DecisionRecord -> pd.v1.DecisionRecord (fields map by name)."""
    return admin_pb2.DecisionRecord(**{f: getattr(r, f) for f in DecisionRecord.__slots__})


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """pd.v1.Admin over the router's Orchestrator."""

    def __init__(self, orchestrator: Orchestrator, secure: bool = False):
        self._orch = orchestrator
        self._secure = secure

    async def _open_transactions(self, context) -> list:
        try:
            return list(await self._orch.directory.list_open_transactions(self._orch.config.directory_timeout_s))
        except WorkerCallError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"directory: {exc.code.name}: {exc.message}")

    async def Status(self, request, context):
        try:
            cluster = await self._orch.view.get(max_age_s=0.0)
        except RouterError as exc:
            await context.abort(grpc_code(exc.code), exc.message)
        open_txns = await self._open_transactions(context)
        decoders = [w for w in cluster.workers if w.can_decode]
        return admin_pb2.StatusResponse(
            workers=[worker_record_to_pb(w) for w in cluster.workers],
            free_blocks=sum(w.load.free_blocks for w in decoders),
            reserved_blocks=sum(w.load.reserved_blocks for w in decoders),
            total_blocks=sum(w.load.total_blocks or w.capacity.total_blocks for w in decoders),
            open_transactions=len(open_txns),
            mode=_RELEASE_OF_MODE[self._orch.default_mode],
            canary_fraction=self._orch.planner.canary_fraction,
            route_epoch=cluster.route_epoch,
            router_mode=self._orch.default_mode)

    async def SetMode(self, request, context):
        previous = _RELEASE_OF_MODE[self._orch.default_mode]
        if request.mode == admin_pb2.RELEASE_MODE_UNSPECIFIED:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "mode is required")
        mode = _MODE_OF_RELEASE.get(request.mode)
        if mode is None:
            name = admin_pb2.ReleaseMode.Name(request.mode) if request.mode in admin_pb2.ReleaseMode.values() \
                else str(request.mode)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                f"{name} comes with the release state machine (rollback order); "
                                "PINNED, SHADOW, CANARY and ACTIVE are available now")
        steps = []
        if mode == "canary":
            if not 0.0 <= request.canary_fraction <= 1.0:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"canary_fraction must be in [0, 1], got {request.canary_fraction}")
            self._orch.planner.canary_fraction = request.canary_fraction
            steps.append(f"CANARY_FRACTION_{request.canary_fraction:g}")
        self._orch.default_mode = mode
        steps.insert(0, f"DEFAULT_MODE_{mode.upper()}")
        log.info("release mode %s -> %s (router mode %s; by %s; reason: %s)", admin_pb2.ReleaseMode.Name(previous),
                 admin_pb2.ReleaseMode.Name(request.mode), mode, caller_name(context), request.reason or "none given")
        return admin_pb2.SetModeResponse(previous_mode=previous, mode=request.mode,
                                         route_epoch=self._orch.view.route_epoch, steps=steps)

    async def Decisions(self, request, context):
        records = self._orch.planner.log.recent(request.limit or DEFAULT_LIST_LIMIT, request.request_id,
                                                caller_tenant(context, self._secure))
        return admin_pb2.DecisionsResponse(records=[record_to_pb(r) for r in records])

    async def Blocks(self, request, context):
        if len(request.request_id.encode()) > MAX_REQUEST_ID_BYTES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request_id is over {MAX_REQUEST_ID_BYTES} bytes")
        try:
            return await blocks(self._orch, request)
        except RouterError as exc:
            await context.abort(grpc_code(exc.code), exc.message)

    async def ListTransactions(self, request, context):
        txns = await self._open_transactions(context)
        states, own = set(request.states), caller_tenant(context, self._secure)
        txns = [t for t in txns if (not states or t.state in states)
                and (not request.tenant or t.tenant == request.tenant) and own in (None, t.tenant)]
        txns.sort(key=lambda t: t.updated_unix_ms, reverse=True)
        return admin_pb2.ListTransactionsResponse(transactions=txns[:request.limit or DEFAULT_LIST_LIMIT])
