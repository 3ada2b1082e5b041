"""An in-process cluster for worker lifecycle tests: the real
`PrefillWorker` and `DecodeWorker`, each on its own `EngineLoop` over the tiny
model, the inproc data plane, and the real directory servicer over the memory
store behind a real gRPC server on loopback (the workers talk to it through the
real `DirectoryClient` and `TxnOps`). No processes: a hand-off can be driven step
by step, in the router's order, and every test ends with `assert_all_returned`
(blocks on both engines, transactions in the directory, credits, receivers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from decode_worker.worker import DecodeWorker
from kv_directory.access import ACCESS, SERVICE_NAME
from kv_directory.config import DirectoryConfig
from kv_directory.memory_store import MemoryDirectoryStore
from kv_directory.server import DirectoryServicer
from pdserve_client.rpc.pd.v1 import directory_pb2_grpc, manifest_pb2
from prefill_worker.worker import PrefillWorker
from router.requests.handoff import prompt_digest
from runtime.common.grpc_server import start_server
from runtime.directory.client import DirectoryClient
from runtime.directory.cost_profile import CostProfile
from runtime.directory.records import WorkerInfo, WorkerRole
from runtime.directory.states import TxnState
from runtime.engine import SamplingParams
from runtime.transfer.base import CHECKSUM_ALGORITHM
from runtime.transfer.inproc import InprocReceiver, InprocSender
from runtime.worker.config import WorkerConfig
from runtime.worker.directory_ops import TxnOps
from runtime.worker.loop import EngineLoop, SeqDone, TokenOut
from runtime.worker.process import capacity
from tests.support import pki
from tests.support.engine import tiny_engine

GREEDY = SamplingParams()


@dataclasses.dataclass
class Node:
    worker_id: str
    loop: EngineLoop
    txn: TxnOps
    epoch: int = 0


class InprocCluster:
    """One prefill and one decode worker; `async with InprocCluster() as c:`."""

    def __init__(self, num_blocks: int = 64, prefill_blocks: int | None = None, **worker_cfg):
        """`prefill_blocks`: the prefill's pool, when it differs from the decode's (`num_blocks`)."""
        self.num_blocks, self.prefill_blocks = num_blocks, prefill_blocks or num_blocks
        self.cfg = WorkerConfig(transport="inproc", num_blocks=num_blocks, reservation_ttl_s=30.0, **worker_cfg)
        self._clients: list[DirectoryClient] = []

    async def __aenter__(self) -> InprocCluster:
        self.store = MemoryDirectoryStore(DirectoryConfig(lease_ttl_s=30.0))
        security = pki.security("directory", "directory")
        self.servicer = DirectoryServicer(self.store, DirectoryConfig(lease_ttl_s=30.0), security)
        self.server, port, _ = await start_server("127.0.0.1:0", [
            (directory_pb2_grpc.add_DirectoryServicer_to_server, self.servicer, SERVICE_NAME)], security, ACCESS)
        self.address = f"127.0.0.1:{port}"
        self.directory = DirectoryClient(self.address, 5.0, pki.security("router", "router"))
        """The router's part (it creates transactions); each node has its own identity."""
        self.p = await self._node("p0", WorkerRole.PREFILL)
        self.d = await self._node("d0", WorkerRole.DECODE)
        self.sender = InprocSender()
        self.receiver = InprocReceiver(f"d0-{id(self)}")
        await self.sender.start()
        await self.receiver.start()
        self.prefill = PrefillWorker(self.cfg.replace(worker_id="p0"), self.p.loop, self.sender,
                                     self.p.txn)
        self.decode = DecodeWorker(self.cfg.replace(worker_id="d0"), self.d.loop, self.receiver,
                                   self.d.txn)
        return self

    async def _node(self, worker_id: str, role: WorkerRole) -> Node:
        blocks = self.prefill_blocks if role is WorkerRole.PREFILL else self.num_blocks
        loop = EngineLoop(tiny_engine(num_blocks=blocks, chunk_tokens=self.cfg.chunk_tokens))
        loop.start()
        node = Node(worker_id, loop, None)
        client = DirectoryClient(self.address, 5.0, pki.security(role.value, worker_id))
        self._clients.append(client)
        node.txn = TxnOps(client, worker_id, lambda: node.epoch)
        reg = await client.register_worker(WorkerInfo(
            worker_id, role, f"{worker_id}:1", f"inproc://{worker_id}", loop.engine.abi.digest,
            capacity(self.cfg, loop), CostProfile(), "", seal_key=node.txn.sealer.public))
        node.epoch = reg.epoch
        return node

    async def __aexit__(self, *exc) -> None:
        await self.receiver.stop()
        await self.sender.close()
        for node in (self.p, self.d):
            node.loop.stop()
        await self.directory.close()
        for client in self._clients:
            await client.close()
        await self.server.stop(None)
        await self.servicer.close()

    # ---- the router's part, written out ----------------------------------------
    def manifest(self, request_id: str, generation: int, prompt: list[int],
                 reservation) -> manifest_pb2.HandoffManifest:
        bs = self.d.loop.engine.block_size
        return manifest_pb2.HandoffManifest(
            request_id=request_id, tenant="t", generation=generation, attempt=1,
            prompt_digest=prompt_digest(prompt, "t"),
            token_interval=manifest_pb2.TokenInterval(start=reservation.first_block * bs, end=len(prompt)),
            cache_abi_digest=self.d.loop.engine.abi.digest, block_size=bs,
            expected_chunks=[manifest_pb2.ChunkSpec(layer=a, block_start=b, block_count=c, num_bytes=n)
                             for a, b, c, n in reservation.expected_layouts()],
            source_worker_id="p0", source_epoch=self.p.epoch, destination_worker_id="d0",
            destination_epoch=self.d.epoch, transfer_id=reservation.transfer_id,
            reservation_id=reservation.transfer_id, checksum_algorithm=CHECKSUM_ALGORITHM)

    async def reserve(self, request_id: str, prompt: list[int], max_tokens: int, generation: int = 1):
        """Decode.Reserve then Directory.Reserve, as the router does; the reservation."""
        res = await self.decode.reserve(request_id, "t", generation, prompt, max_tokens, GREEDY,
                                        self.p.loop.engine.abi.digest)
        reply = await self.directory.reserve(self.manifest(request_id, generation, prompt, res))
        assert reply.ok, reply
        return res

    def router_stream(self, res) -> asyncio.Future:
        """The router's DecodeStream of reservation `res`, as a task: its tokens, or its error
        (RuntimeError: the transfer was aborted). The router sends it once the directory
        recorded the transfer, and the decode publishes only after it came."""
        return asyncio.ensure_future(self.collect(self.decode.stream(res.transfer_id)))

    async def handoff(self, request_id: str, prompt: list[int], max_tokens: int, generation: int = 1):
        """A whole split request: (tokens, the prefill's outcome)."""
        res = await self.reserve(request_id, prompt, max_tokens, generation)
        stream = self.router_stream(res)
        outcome = await self.send(request_id, res, prompt, generation=generation)
        return await stream, outcome

    def send(self, request_id: str, res, prompt: list[int], chunks=None, generation: int = 1):
        """The router's Prefill call for reservation `res` (compute, send, commit), as a
        coroutine; `chunks`: the expected list the prefill is given (default: the reservation's)."""
        return self.prefill.prefill(
            request_id=request_id, tenant="t", generation=generation, transfer_id=res.transfer_id,
            first_token_pos=res.first_block * self.d.loop.engine.block_size, prompt=prompt, sampling=GREEDY,
            dest=self.receiver.address, abi_digest=self.d.loop.engine.abi.digest,
            chunks=res.expected_layouts() if chunks is None else chunks)

    @staticmethod
    async def collect(items) -> list[int]:
        tokens = []
        async for item in items:
            if isinstance(item, TokenOut):
                tokens.append(item.token_id)
            else:
                assert isinstance(item, SeqDone) and item.error is None, item
        return tokens

    async def colocated(self, request_id: str, prompt: list[int], max_tokens: int) -> list[int]:
        return await self.collect(self.decode.generate(request_id, "t", 1, prompt, max_tokens, GREEDY))

    # ---- everything returned -----------------------------------------------------
    async def assert_all_returned(self, timeout_s: float = 10.0) -> None:
        """Blocks back on both engines, no open transaction and no publication left unreleased
        (the decode releases it after the stream's end, on its own task), no credit in
        flight, no transfer expected by the receiver, no reservation or prefill task left."""
        deadline = time.monotonic() + timeout_s
        while True:
            held = {n.worker_id: n.loop.engine.blocks.num_blocks - n.loop.engine.num_free_blocks
                    for n in (self.p, self.d)}
            open_txns = [(t.transfer_id, t.state.name) for t in await self.directory.list_open()]
            open_txns += [(t.transfer_id, t.state.name) for t in self.store.all_transactions()
                          if t.state is TxnState.PUBLISHED]
            windows = {d: w.in_flight for d, w in getattr(self.sender, "credit_windows", dict)().items()
                       if w.in_flight}
            left = dict(held={k: v for k, v in held.items() if v}, open=open_txns, credits=windows,
                        expected=list(self.receiver.pending), reservations=list(self.decode.reservations),
                        prefills=list(self.prefill.tasks))
            if not any(left.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not returned: {left}")
            await asyncio.sleep(0.05)
