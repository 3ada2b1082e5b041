"""Admin servicer: cluster status, transaction listing, decisions, who holds which blocks
(router/blocks.py), and the release (router/release/admin.py: status, promote, rollback,
SetMode). Status reports the release state of the record the directory keeps (before
any was written: the state of the router's configured mode) and the exact router mode.
"""

from __future__ import annotations

import logging

import grpc

from pdserve_client.contract import MAX_REQUEST_ID_BYTES
from pdserve_client.rpc.pd.v1 import admin_pb2, admin_pb2_grpc
from router.blocks import blocks
from router.grpc_gateway import grpc_code
from router.identity import caller_tenant
from router.release.admin import ReleaseAdmin
from router.release.controller import ReleaseController
from router.requests.orchestrator import Orchestrator
from router.requests.records import DecisionRecord
from router.types import RouterError, WorkerCallError
from runtime.directory.wire import worker_record_to_pb
from runtime.release.machine import RELEASE_OF_MODE

log = logging.getLogger(__name__)

DEFAULT_LIST_LIMIT = 100



def record_to_pb(r: DecisionRecord) -> admin_pb2.DecisionRecord:
    """DecisionRecord -> pd.v1.DecisionRecord (fields map by name)."""
    return admin_pb2.DecisionRecord(**{f: getattr(r, f) for f in DecisionRecord.__slots__})


class AdminServicer(ReleaseAdmin, admin_pb2_grpc.AdminServicer):
    """pd.v1.Admin over the router's Orchestrator and its ReleaseController."""

    def __init__(self, orchestrator: Orchestrator, release: ReleaseController, secure: bool = False):
        self._orch = orchestrator
        self._release = release
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
            mode=int(self._release.record.state if self._release.record is not None
                     else RELEASE_OF_MODE[self._orch.default_mode]),
            canary_fraction=self._orch.planner.canary_fraction,
            route_epoch=cluster.route_epoch,
            router_mode=self._orch.default_mode)

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
