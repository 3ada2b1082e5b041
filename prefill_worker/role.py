"""The prefill role of a worker node: serves pd.v1.Prefill, sends K/V (runtime/worker/node.py)."""

from __future__ import annotations

import asyncio

from pdserve_client.rpc.pd.v1 import prefill_pb2_grpc
from runtime.common.grpc_server import Registration
from runtime.worker.holdings import Claim, HoldState
from runtime.worker.node import Role, WorkerNode, source_gate
from runtime.worker.process import build_sender

from .server import PrefillServicer
from .worker import PrefillWorker, TaskState


class PrefillRole(Role):
    name = "prefill"

    def __init__(self):
        self.sender = None
        self.worker: PrefillWorker | None = None

    async def start(self, node: WorkerNode) -> Registration:
        self.sender = build_sender(node.cfg, node.security)
        await self.sender.start()
        self.worker = PrefillWorker(node.cfg, node.loop, self.sender, node.txn, source_gate(node), node.metrics)
        return prefill_pb2_grpc.add_PrefillServicer_to_server, PrefillServicer(self.worker), "pd.v1.Prefill"

    @property
    def transports(self) -> list:
        return [self.sender]

    def in_flight(self) -> int:
        return len(self.worker.tasks)

    def waiting_prompt_tokens(self) -> int:
        return self.worker.room.waiting_tokens

    def claims(self) -> dict[int, Claim]:
        # Computing: PREFILLING until the first token, then its chunks leave (SENDING).
        return {id(t.seq): (HoldState.SENDING, HoldState.SENDING) if t.state is TaskState.COMMITTING
                else (HoldState.PREFILLING, HoldState.SENDING)
                for t in list(self.worker.tasks.values()) if t.seq is not None}

    async def stop(self) -> None:
        # A drain's budget is spent: what still runs is cancelled (each aborts its transfer at
        # the destination and in the directory, and frees its blocks).
        runners = [t.runner for t in list(self.worker.tasks.values()) if t.runner is not None]
        for t in list(self.worker.tasks.values()):
            await self.worker.cancel(t.request_id, t.generation)
        if runners:
            await asyncio.wait(runners, timeout=5.0)

    async def close(self) -> None:
        await self.sender.close()
