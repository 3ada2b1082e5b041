"""pd.v1.WorkerAdmin on every worker node: proto -> holdings (runtime/worker/holdings.py)
-> proto. Router-only, like every worker RPC (`router_only` in node.py)."""

from __future__ import annotations

import grpc

from pdserve_client.contract import MAX_REQUEST_ID_BYTES
from pdserve_client.rpc.pd.v1 import blocks_pb2, blocks_pb2_grpc

from . import holdings

WORKER_ADMIN_SERVICE = blocks_pb2.DESCRIPTOR.services_by_name["WorkerAdmin"].full_name


def view_to_pb(v: holdings.BlockView, worker_id: str, epoch: int) -> blocks_pb2.WorkerBlocks:
    """A BlockView as pd.v1.WorkerBlocks."""
    return blocks_pb2.WorkerBlocks(
        worker_id=worker_id, epoch=epoch, total_blocks=v.total, free_blocks=v.free,
        cached_prefix_blocks=v.cached_prefix, reserved_blocks=v.reserved, active_blocks=v.active,
        holdings=[blocks_pb2.BlockHolding(
            request_id=h.request_id, tenant=h.tenant, transfer_id=h.transfer_id, generation=h.generation,
            state=int(h.state), age_s=h.age_s, num_blocks=len(h.block_ids), charged_blocks=h.charged,
            ranges=[blocks_pb2.BlockRange(start=s, count=n) for s, n in holdings.ranges(h.block_ids)])
            for h in v.holdings])


class WorkerAdminServicer(blocks_pb2_grpc.WorkerAdminServicer):
    """Serves pd.v1.WorkerAdmin for one node: its engine loop and its roles' records."""

    def __init__(self, node, roles):
        self.node = node
        self.roles = roles

    async def Blocks(self, request, context):
        if len(request.request_id.encode()) > MAX_REQUEST_ID_BYTES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"request_id is over {MAX_REQUEST_ID_BYTES} bytes")
        snap = await self.node.loop.call(holdings.take)
        claims: dict[int, holdings.Claim] = {}
        for role in self.roles:  # after the engine was read: see holdings.py's safety invariant
            claims.update(role.claims())
        return view_to_pb(holdings.view(snap, claims, request.request_id), self.node.cfg.worker_id,
                          self.node.epoch)


def registration(node, roles):
    """The WorkerAdmin registration for `start_server`."""
    return blocks_pb2_grpc.add_WorkerAdminServicer_to_server, WorkerAdminServicer(node, roles), WORKER_ADMIN_SERVICE
