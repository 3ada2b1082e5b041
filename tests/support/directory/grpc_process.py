"""A real ``python -m kv_directory`` process on a real redis-server, and the callers that
drive it under the certificates a cluster's processes hold (tests/integration/test_directory_*.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve_client.rpc.pd.v1 import manifest_pb2
from runtime.directory.client import DirectoryClient
from runtime.directory.records import WorkerCapacity, WorkerInfo, WorkerRole
from runtime.directory.states import Outcome, TxnState
from tests.support import pki
from tooling.cluster.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
SERVICE = "pd.v1.Directory"
CAP = WorkerCapacity(total_blocks=64, max_decode_batch=8, max_prefill_tokens=2048, block_size=16,
                     vocab_size=32000, max_model_len=4096)
CHECKSUMS = ["c0", "c1", "c2"]
RECEIVED = [manifest_pb2.ChunkSpec(layer=i, block_count=3, num_bytes=1024, checksum=c) for i, c in enumerate(CHECKSUMS)]
"""What the destination received: the manifest's expected chunks (3 layers x 3 blocks)."""
KV_DIGEST = "ab" * 16
"""The K/V digest the source declares at Begin and the destination matches."""


class DirectoryProcess:
    """One ``python -m kv_directory`` subprocess under its own Redis key prefix."""

    def __init__(self, redis_url: str, **env: str):
        self.prefix = "{dirgrpc-" + uuid.uuid4().hex[:10] + "}"
        self.address = f"127.0.0.1:{free_port()}"
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kv_directory", "--listen", self.address, "--redis-url", redis_url],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, **pki.env("directory", "directory"), "PD_DIRECTORY_KEY_PREFIX": self.prefix, **env},
        )
        self._wait_serving()

    def output(self) -> str:
        """Everything the process logged so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def _wait_serving(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        with pki.security("operator", "operator").channel(self.address, "directory") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"directory exited {self.proc.returncode}:\n{self.output()}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=0.5)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError(f"directory not SERVING after {timeout_s}s:\n{self.output()}")

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit status (killed -> -9)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode



class Callers:
    """One DirectoryClient per certificate, each call sent as whoever makes it in a
    cluster: a worker registers, heartbeats and moves transactions under its own id;
    the router reserves, aborts as a non-end, and reads. Everything else is the router's."""

    def __init__(self, address: str, timeout_s: float = 5.0):
        self.address, self.timeout_s = address, timeout_s
        self._clients: dict[tuple[str, str], DirectoryClient] = {}
        self._roles: dict[str, str] = {}

    def as_(self, role: str, name: str) -> DirectoryClient:
        key = (role, name)
        if key not in self._clients:
            self._clients[key] = DirectoryClient(self.address, self.timeout_s, pki.security(role, name))
        return self._clients[key]

    @property
    def router(self) -> DirectoryClient:
        return self.as_("router", "router")

    def worker(self, worker_id: str) -> DirectoryClient:
        """A registered worker's client (an unknown id: some decode worker's)."""
        return self.as_(self._roles[worker_id], worker_id) if worker_id in self._roles else \
            self.as_("decode", "anyone")

    async def register_worker(self, info: WorkerInfo):
        self._roles[info.worker_id] = WorkerRole(info.role).value
        return await self.worker(info.worker_id).register_worker(info)

    async def heartbeat(self, worker_id: str, *a, **kw):
        return await self.worker(worker_id).heartbeat(worker_id, *a, **kw)

    def _as(self, rpc: str, worker_id: str):
        """A transition is sent by the worker it names; an abort naming no worker, by the router."""
        by = self.router if rpc == "abort" and worker_id not in self._roles else self.worker(worker_id)
        return getattr(by, rpc)

    async def begin(self, rid, tid, gen, worker_id, *a, **kw):
        if kw.get("kv_digest"):  # a declaration carries the source's chunk list with checksums
            kw.setdefault("chunks", RECEIVED)
        return await self._as("begin", worker_id)(rid, tid, gen, worker_id, *a, **kw)

    async def validated(self, rid, tid, gen, worker_id, *a, **kw):
        return await self._as("validated", worker_id)(rid, tid, gen, worker_id, *a, **kw)

    async def publish(self, rid, tid, gen, worker_id, *a, **kw):
        return await self._as("publish", worker_id)(rid, tid, gen, worker_id, *a, **kw)

    async def release(self, rid, tid, gen, worker_id, *a, **kw):
        return await self._as("release", worker_id)(rid, tid, gen, worker_id, *a, **kw)

    async def abort(self, rid, tid, gen, worker_id, *a, **kw):
        return await self._as("abort", worker_id)(rid, tid, gen, worker_id, *a, **kw)

    def __getattr__(self, name: str):
        return getattr(self.router, name)

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()


def run(address: str, scenario) -> None:
    """Run ``scenario(callers)`` in a fresh event loop, then the leak check."""

    async def main() -> None:
        client = Callers(address)
        try:
            await scenario(client)
            assert await client.list_open() == []
        finally:
            await client.close()

    asyncio.run(main())


def uid(name: str) -> str:
    """A name no other test uses on the shared directory."""
    return f"{name}-{uuid.uuid4().hex[:6]}"


async def two_workers(client: Callers):
    """Register a prefill and a decode worker; returns their (id, epoch) pairs."""
    p, d = uid("p"), uid("d")
    rp = await client.register_worker(WorkerInfo(p, WorkerRole.PREFILL, f"{p}:1", f"{p}:2", "abi", CAP))
    rd = await client.register_worker(WorkerInfo(d, WorkerRole.DECODE, f"{d}:1", f"{d}:2", "abi", CAP))
    return (p, rp.epoch), (d, rd.epoch)


def manifest(src, dst, tid: str, rid: str, gen: int = 1, checksums=CHECKSUMS, end: int = 48,
             **extra) -> manifest_pb2.HandoffManifest:
    """A manifest for ``tid`` from ``src`` to ``dst`` ((id, epoch) pairs)."""
    return manifest_pb2.HandoffManifest(
        request_id=rid, tenant="acme", generation=gen, transfer_id=tid, block_size=16,
        token_interval=manifest_pb2.TokenInterval(start=0, end=end), reservation_id=f"res-{tid}",
        expected_chunks=[manifest_pb2.ChunkSpec(layer=i, block_count=3, num_bytes=1024, checksum=c)
                         for i, c in enumerate(checksums)],
        source_worker_id=src[0], source_epoch=src[1], destination_worker_id=dst[0], destination_epoch=dst[1],
        checksum_algorithm="xxh3_64", **{"cache_abi_digest": "abi", **extra},
    )


async def drive_to(client, rid, tid, gen, src, dst, state: TxnState, start: TxnState = TxnState.RESERVED) -> None:
    """Move a transaction from ``start`` to ``state`` (<= PUBLISHED) as its ends would:
    the source begins, the destination validates and publishes."""
    steps = [
        (TxnState.TRANSFERRING, lambda: client.begin(rid, tid, gen, *src, kv_digest=KV_DIGEST)),
        (TxnState.VALIDATED, lambda: client.validated(rid, tid, gen, *dst, KV_DIGEST, RECEIVED)),
        (TxnState.PUBLISHED, lambda: client.publish(rid, tid, gen, *dst, kv_digest=KV_DIGEST)),
    ]
    for target, step in steps:
        if target > state:
            return
        if target <= start:
            continue
        r = await step()
        assert (r.outcome, r.state) == (Outcome.APPLIED, target)
