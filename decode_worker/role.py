"""The decode role of a worker node: reserves blocks, receives K/V, validates,
publishes and decodes; serves pd.v1.Decode (runtime/worker/node.py)."""

from __future__ import annotations

from pdserve_client.rpc.pd.v1 import decode_pb2_grpc
from runtime.common.grpc_server import Registration
from runtime.worker.holdings import Claim, HoldState
from runtime.worker.node import Role, WorkerNode, destination_gate
from runtime.worker.process import build_receiver

from .reservations import ResState
from .server import DecodeServicer
from .worker import DecodeWorker

_CLAIMS: dict[ResState, Claim] = {
    ResState.RESERVED: (HoldState.RESERVED, HoldState.RESERVED),
    ResState.RECEIVING: (HoldState.RECEIVING, HoldState.RECEIVING),
    ResState.PUBLISHED: (HoldState.PUBLISHED, HoldState.DECODING),
    # Over, its blocks on their way back (an abort frees after fencing the receiver).
    ResState.FINISHED: (HoldState.PUBLISHED, HoldState.DECODING),
    ResState.ABORTED: (HoldState.RESERVED, HoldState.DECODING),
}


class DecodeRole(Role):
    name = "decode"

    def __init__(self):
        self.receiver = None
        self.worker: DecodeWorker | None = None

    async def start(self, node: WorkerNode) -> Registration:
        self.receiver = build_receiver(node.cfg, node.security)
        await self.receiver.start()
        self.worker = DecodeWorker(node.cfg, node.loop, self.receiver, node.txn, destination_gate(node),
                                   node.metrics)
        servicer = DecodeServicer(self.worker, node.cfg.worker_id, lambda: node.epoch)
        return decode_pb2_grpc.add_DecodeServicer_to_server, servicer, "pd.v1.Decode"

    @property
    def data_plane_address(self) -> str:
        return self.receiver.address

    @property
    def transports(self) -> list:
        return [self.receiver]

    def reserved_blocks(self) -> int:
        return self.worker.reserved_blocks()

    def in_flight(self) -> int:
        # Reservations (before and after publication), colocated streams, and finished
        # sequences whose tokens no DecodeStream has read yet.
        w = self.worker
        return len(w.reservations) + len(w.colocated) + len(w.unread)

    def claims(self) -> dict[int, Claim]:
        w = self.worker
        out = {id(r.seq): _CLAIMS[r.state] for r in list(w.reservations.values())}
        out.update((id(seq), (HoldState.PREFILLING, HoldState.DECODING)) for seq in list(w.colocated.values()))
        return out

    async def on_lease_lost(self) -> None:
        # The directory already aborted this worker's unpublished transactions.
        await self.worker.abort_all_unpublished("lease lost")

    async def stop(self) -> None:
        await self.worker.abort_all_unpublished("worker shutting down")

    async def close(self) -> None:
        await self.receiver.stop()
