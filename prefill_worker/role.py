"""The prefill role of a worker node: serves pd.v1.Prefill, sends K/V (services/worker/node.py)."""

from __future__ import annotations

from pdserve_client.rpc.pd.v1 import prefill_pb2_grpc
from services.common.grpc_server import Registration
from services.worker.node import Role, WorkerNode, source_gate
from services.worker.process import build_sender

from .server import PrefillServicer
from .worker import PrefillWorker


class PrefillRole(Role):
    name = "prefill"

    def __init__(self):
        self.sender = None

    async def start(self, node: WorkerNode) -> Registration:
        self.sender = build_sender(node.cfg, node.security)
        await self.sender.start()
        worker = PrefillWorker(node.cfg, node.loop, self.sender, node.txn, source_gate(node), node.metrics)
        return prefill_pb2_grpc.add_PrefillServicer_to_server, PrefillServicer(worker), "pd.v1.Prefill"

    @property
    def transports(self) -> list:
        return [self.sender]

    async def close(self) -> None:
        await self.sender.close()
