"""Admin servicer: cluster status, release mode, transaction listing.

Release modes implemented so far (article 0x0FF): PINNED (requests without a
mode run colocated) and ACTIVE (they run disaggregated). SHADOW, CANARY and
ROLLED_BACK (with the 0x0FG rollback order) come with the release state
machine and answer UNIMPLEMENTED until then.
"""

from __future__ import annotations

import logging

import grpc

from router.convert import worker_to_pb
from router.grpc_gateway import grpc_code
from router.orchestrator import Orchestrator
from router.types import Route, RouterError, WorkerCallError
from services.rpc.pd.v1 import admin_pb2, admin_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_LIST_LIMIT = 100

_MODE_OF_ROUTE = {Route.COLOCATED: admin_pb2.RELEASE_MODE_PINNED, Route.DISAGGREGATED: admin_pb2.RELEASE_MODE_ACTIVE}
_ROUTE_OF_MODE = {v: k for k, v in _MODE_OF_ROUTE.items()}


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """pd.v1.Admin over the router's Orchestrator."""

    def __init__(self, orchestrator: Orchestrator):
        self._orch = orchestrator

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
            workers=[worker_to_pb(w) for w in cluster.workers],
            free_blocks=sum(w.load.free_blocks for w in decoders),
            reserved_blocks=sum(w.load.reserved_blocks for w in decoders),
            total_blocks=sum(w.load.total_blocks or w.capacity.total_blocks for w in decoders),
            open_transactions=len(open_txns),
            mode=_MODE_OF_ROUTE[self._orch.default_route],
            canary_fraction=0.0,
            route_epoch=cluster.route_epoch)

    async def SetMode(self, request, context):
        previous = _MODE_OF_ROUTE[self._orch.default_route]
        if request.mode == admin_pb2.RELEASE_MODE_UNSPECIFIED:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "mode is required")
        route = _ROUTE_OF_MODE.get(request.mode)
        if route is None:
            name = admin_pb2.ReleaseMode.Name(request.mode) if request.mode in admin_pb2.ReleaseMode.values() \
                else str(request.mode)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                f"{name} comes with the release state machine (shadow/canary/rollback); "
                                "PINNED and ACTIVE are available now")
        self._orch.default_route = route
        log.info("release mode %s -> %s (reason: %s)", admin_pb2.ReleaseMode.Name(previous),
                 admin_pb2.ReleaseMode.Name(request.mode), request.reason or "none given")
        return admin_pb2.SetModeResponse(previous_mode=previous, mode=request.mode,
                                         route_epoch=self._orch.view.route_epoch,
                                         steps=[f"DEFAULT_ROUTE_{route.name}"])

    async def ListTransactions(self, request, context):
        txns = await self._open_transactions(context)
        states = set(request.states)
        txns = [t for t in txns if (not states or t.state in states) and (not request.tenant or t.tenant == request.tenant)]
        txns.sort(key=lambda t: t.updated_unix_ms, reverse=True)
        return admin_pb2.ListTransactionsResponse(transactions=txns[:request.limit or DEFAULT_LIST_LIMIT])
