"""The Directory gRPC service as a real process (``python -m kv_directory``) on a
real redis-server, driven through ``DirectoryClient`` with mutual TLS on: every call
goes out under the certificate its caller would hold (``Callers``: the router reserves
and reads, each worker registers and moves transactions as itself).

Every test ends with a leak check: no open transaction is left behind.
"""

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
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from pdserve_client.rpc.pd.v1 import directory_pb2, directory_pb2_grpc, manifest_pb2
from services.cluster.redis_proc import free_port, start_redis
from services.directory.client import DirectoryClient, TransferNotRecorded
from services.directory.records import (
    DirectoryUnavailable,
    LoadReport,
    WorkerCapacity,
    WorkerInfo,
    WorkerRole,
)
from services.directory.states import Outcome, TxnState
from tests.support import pki

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.fixture(scope="module")
def directory(redis_server):
    """The shared directory process; its clean SIGTERM exit is checked at the end."""
    proc = DirectoryProcess(redis_server.url)
    yield proc
    assert proc.stop() == 0, proc.output()


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


# ---- service surface -------------------------------------------------------

def test_health_and_reflection(directory):
    with pki.security("router", "router").channel(directory.address, "directory") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                            timeout=2)
        names = {s.name for r in replies for s in r.list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health"} <= names


def test_start_fails_clearly_without_redis():
    dead_port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "kv_directory", "--listen", "127.0.0.1:0",
         "--redis-url", f"redis://127.0.0.1:{dead_port}/0"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
        env={**os.environ, **pki.env("directory", "directory"), "PD_REDIS_TIMEOUT_S": "0.5"},
    )
    assert proc.returncode != 0
    assert "redis unreachable" in proc.stderr and str(dead_port) in proc.stderr


# ---- registry --------------------------------------------------------------

def test_register_heartbeat_snapshot(directory):
    async def scenario(client: Callers):
        (p, ep), (d, ed) = await two_workers(client)
        m = uid("m")
        reg = await client.register_worker(WorkerInfo(m, "mixed", f"{m}:1", f"{m}:2", "abi", CAP))
        assert ep >= 1 and ed >= 1 and reg.epoch >= 1 and reg.lease_ttl_ms == 10_000

        load = LoadReport(pending_prefill_tokens=100, active_decode_batch=3, free_blocks=40,
                          reserved_blocks=8, total_blocks=64)
        lease = await client.heartbeat(d, ed, load)
        assert lease.ok and lease.lease_ttl_ms == 10_000
        assert not (await client.heartbeat(d, ed + 1, load)).ok  # not the live epoch

        snap = await client.snapshot()
        w = snap.worker(d)
        assert (w.role, w.grpc_address, w.data_plane_address, w.cache_abi_digest, w.epoch) == \
            (WorkerRole.DECODE, f"{d}:1", f"{d}:2", "abi", ed)
        assert (w.capacity, w.load) == (CAP, load)
        assert w.lease_expiry_ms > snap.now_ms > time.time() * 1000 - 60_000
        assert snap.worker(p).load == LoadReport(free_blocks=64, total_blocks=64)  # registered, no heartbeat yet
        decode_side = {w.worker_id for w in (await client.snapshot(WorkerRole.DECODE)).workers}
        assert {d, m} <= decode_side and p not in decode_side
        prefill_side = {w.worker_id for w in (await client.snapshot(WorkerRole.PREFILL)).workers}
        assert {p, m} <= prefill_side and d not in prefill_side

        again = await client.register_worker(WorkerInfo(d, "decode", f"{d}:1", f"{d}:2", "abi", CAP))
        assert again.epoch > ed
        assert not (await client.heartbeat(d, ed, load)).ok  # the old incarnation is fenced

    run(directory.address, scenario)


# ---- transactions ----------------------------------------------------------

def test_full_lifecycle(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, tid = uid("r"), uid("t")
        m = manifest(src, dst, tid, rid)
        r = await client.reserve(m)
        assert (r.outcome, r.state, r.current_generation) == (Outcome.APPLIED, TxnState.RESERVED, 1)
        assert [t.transfer_id for t in await client.list_open(dst[0])] == [tid]
        await drive_to(client, rid, tid, 1, src, dst, TxnState.PUBLISHED)
        again = await client.publish(rid, tid, 1, *dst, kv_digest=KV_DIGEST)
        assert (again.outcome, again.state) == (Outcome.DUPLICATE, TxnState.PUBLISHED)
        released = await client.release(rid, tid, 1, *src)
        assert (released.outcome, released.state) == (Outcome.APPLIED, TxnState.RELEASED)

        rec = await client.lookup(rid, tid)
        assert rec.state == TxnState.RELEASED and rec.manifest == m
        assert (rec.kv_digest, rec.chunks_expected, rec.reservation_id) == (KV_DIGEST, 3, f"res-{tid}")
        assert (rec.source.worker_id, rec.dest.epoch) == (src[0], dst[1])
        assert await client.lookup("another-request", tid) is None
        assert await client.lookup(rid, "no-such-transfer") is None

    run(directory.address, scenario)


def test_illegal_and_fenced_transitions(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, tid = uid("r"), uid("t")
        await client.reserve(manifest(src, dst, tid, rid))

        async def outcome(call) -> Outcome:
            r = await call
            assert r.state == TxnState.RESERVED  # a rejection changes nothing
            return r.outcome

        assert await outcome(client.publish(rid, tid, 1, *dst, KV_DIGEST)) == Outcome.ILLEGAL_TRANSITION
        assert await outcome(client.release(rid, tid, 1, *src)) == Outcome.ILLEGAL_TRANSITION
        assert await outcome(client.begin(rid, tid, 1, src[0], src[1] + 1)) == Outcome.LEASE_LOST  # STALE_EPOCH
        assert await outcome(client.begin(rid, tid, 2, *src)) == Outcome.STALE_GENERATION
        assert await outcome(client.begin("other", tid, 1, *src)) == Outcome.CHECKSUM_CONFLICT
        assert (await client.begin(rid, "no-such", 1, *src)).outcome == Outcome.NOT_FOUND

        async def denied(call, state: TxnState) -> None:
            """The wrong end moving it: refused by certificate, nothing changed."""
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert (await client.lookup(rid, tid)).state == state

        await denied(client.begin(rid, tid, 1, *dst), TxnState.RESERVED)  # only the source begins

        await drive_to(client, rid, tid, 1, src, dst, TxnState.TRANSFERRING)
        await denied(client.validated(rid, tid, 1, *src, KV_DIGEST, RECEIVED), TxnState.TRANSFERRING)
        await drive_to(client, rid, tid, 1, src, dst, TxnState.VALIDATED, start=TxnState.TRANSFERRING)
        await denied(client.publish(rid, tid, 1, *src, kv_digest=KV_DIGEST), TxnState.VALIDATED)

        aborted = await client.abort(rid, tid, 1, "router-0", 0, reason="client gone")  # the router: allowed
        assert (aborted.outcome, aborted.state) == (Outcome.APPLIED, TxnState.ABORTED)
        assert (await client.abort(rid, tid, 1, *dst)).outcome == Outcome.DUPLICATE
        late = await client.publish(rid, tid, 1, *dst, kv_digest=KV_DIGEST)
        assert (late.outcome, late.state) == (Outcome.ILLEGAL_TRANSITION, TxnState.ABORTED)
        assert (await client.lookup(rid, tid)).abort_reason == "client gone"

    run(directory.address, scenario)


def test_a_wrong_kv_digest_or_a_partial_chunk_list_is_refused_at_the_directory(directory):
    """The directory is the judge of a hand-off's bytes: VALIDATED needs the
    destination's K/V digest to be the one the source declared, and the chunks it
    received to be exactly the manifest's expected list."""
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, tid = uid("r"), uid("t")
        await client.reserve(manifest(src, dst, tid, rid))
        assert (await client.begin(rid, tid, 1, *src)).state == TxnState.TRANSFERRING  # no digest yet
        undeclared = await client.validated(rid, tid, 1, *dst, KV_DIGEST, RECEIVED)
        assert (undeclared.outcome, undeclared.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        assert (await client.begin(rid, tid, 1, *src, kv_digest=KV_DIGEST)).outcome == Outcome.APPLIED
        redeclared = await client.begin(rid, tid, 1, *src, kv_digest="cd" * 16)
        assert redeclared.outcome == Outcome.CHECKSUM_CONFLICT  # declared once
        with pytest.raises(ValueError, match="chunks"):  # a digest comes with its chunk list
            await client.begin(rid, tid, 1, *src, kv_digest=KV_DIGEST, chunks=())

        wrong = await client.validated(rid, tid, 1, *dst, "cd" * 16, RECEIVED)
        assert (wrong.outcome, wrong.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        for partial in (RECEIVED[:2], RECEIVED[::-1], RECEIVED + RECEIVED[:1]):
            r = await client.validated(rid, tid, 1, *dst, KV_DIGEST, partial)
            assert (r.outcome, r.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        bigger = [manifest_pb2.ChunkSpec(layer=c.layer, block_count=3, num_bytes=2048) for c in RECEIVED]
        r = await client.validated(rid, tid, 1, *dst, KV_DIGEST, bigger)
        assert r.outcome == Outcome.CHECKSUM_CONFLICT
        assert (await client.lookup(rid, tid)).state == TxnState.TRANSFERRING  # nothing changed

        flipped = [manifest_pb2.ChunkSpec(layer=c.layer, block_count=3, num_bytes=1024, checksum=c.checksum + "x")
                   for c in RECEIVED]  # the layout is right, a checksum is not the source's
        r = await client.validated(rid, tid, 1, *dst, KV_DIGEST, flipped)
        assert (r.outcome, r.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)

        right = await client.validated(rid, tid, 1, *dst, KV_DIGEST, RECEIVED)
        assert (right.outcome, right.state) == (Outcome.APPLIED, TxnState.VALIDATED)
        other = await client.publish(rid, tid, 1, *dst, "cd" * 16)
        assert (other.outcome, other.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.VALIDATED)
        with pytest.raises(ValueError, match="kv_digest"):
            await client.publish(rid, tid, 1, *dst, "")
        assert (await client.publish(rid, tid, 1, *dst, KV_DIGEST)).state == TxnState.PUBLISHED
        assert (await client.lookup(rid, tid)).kv_digest == KV_DIGEST
        assert (await client.release(rid, tid, 1, *dst)).ok

    run(directory.address, scenario)


def test_publish_with_the_received_chunks_validates_and_publishes_in_one_call(directory):
    """The destination's one round trip: Publish with its chunk list judges as Validated
    does, then publishes; the first refusal is the answer. Only the destination may."""
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, tid = uid("r"), uid("t")
        await client.reserve(manifest(src, dst, tid, rid))
        await client.begin(rid, tid, 1, *src, kv_digest=KV_DIGEST, chunks=RECEIVED)
        wrong = await client.publish(rid, tid, 1, *dst, "cd" * 16, RECEIVED)
        assert (wrong.outcome, wrong.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        partial = await client.publish(rid, tid, 1, *dst, KV_DIGEST, RECEIVED[:2])
        assert (partial.outcome, partial.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        with pytest.raises(grpc.aio.AioRpcError) as err:  # the source may not publish
            await client.publish(rid, tid, 1, *src, KV_DIGEST, RECEIVED)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert (await client.lookup(rid, tid)).state == TxnState.TRANSFERRING
        both = await client.publish(rid, tid, 1, *dst, KV_DIGEST, RECEIVED)
        assert (both.outcome, both.state) == (Outcome.APPLIED, TxnState.PUBLISHED)
        assert (await client.publish(rid, tid, 1, *dst, KV_DIGEST, RECEIVED)).outcome == Outcome.DUPLICATE
        assert (await client.release(rid, tid, 1, *dst)).ok

    run(directory.address, scenario)


def test_a_manifest_whose_chunks_do_not_tile_its_interval_is_invalid(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        with pytest.raises(ValueError, match="expected_chunks do not tile"):
            await client.reserve(manifest(src, dst, uid("t"), uid("r"), end=64))
        assert await client.list_open(dst[0]) == []

    run(directory.address, scenario)


def test_stale_generation_publish(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, t1, t2, t3 = uid("r"), uid("t1"), uid("t2"), uid("t3")
        await client.reserve(manifest(src, dst, t1, rid, gen=1))
        await drive_to(client, rid, t1, 1, src, dst, TxnState.VALIDATED)
        # Reroute: generation 2 supersedes the unpublished generation 1.
        assert (await client.reserve(manifest(src, dst, t2, rid, gen=2))).outcome == Outcome.APPLIED
        old = await client.lookup(rid, t1)
        assert (old.state, old.abort_reason) == (TxnState.ABORTED, "superseded")
        late = await client.publish(rid, t1, 1, *dst, kv_digest=KV_DIGEST)
        assert (late.outcome, late.state) == (Outcome.STALE_GENERATION, TxnState.ABORTED)
        stale = await client.reserve(manifest(src, dst, t3, rid, gen=1))
        assert (stale.outcome, stale.state) == (Outcome.STALE_GENERATION, None)
        await drive_to(client, rid, t2, 2, src, dst, TxnState.PUBLISHED)
        assert (await client.release(rid, t2, 2, *src)).ok

    run(directory.address, scenario)


def test_duplicate_transfer_id_and_conflicting_checksum(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, tid = uid("r"), uid("t")
        m = manifest(src, dst, tid, rid)
        assert (await client.reserve(m)).outcome == Outcome.APPLIED
        dup = await client.reserve(m)
        assert (dup.outcome, dup.state) == (Outcome.DUPLICATE, TxnState.RESERVED)
        conflict = await client.reserve(manifest(src, dst, tid, rid, checksums=["c0", "XX", "c2"]))
        assert (conflict.outcome, conflict.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.RESERVED)
        other_attempt = await client.reserve(manifest(src, dst, tid, rid, attempt=1))
        assert other_attempt.outcome == Outcome.CHECKSUM_CONFLICT
        assert (await client.lookup(rid, tid)).manifest == m  # the original is kept
        assert (await client.abort(rid, tid, 1, *dst, reason="test done")).ok

    run(directory.address, scenario)


def test_list_open_by_worker(directory):
    async def scenario(client: Callers):
        (p, ep), d1 = await two_workers(client)
        _, d2 = await two_workers(client)
        r1, r2, t1, t2 = uid("r"), uid("r"), uid("t"), uid("t")
        await client.reserve(manifest((p, ep), d1, t1, r1))
        await client.reserve(manifest((p, ep), d2, t2, r2))
        assert [t.transfer_id for t in await client.list_open(p)] == sorted([t1, t2])
        assert [t.transfer_id for t in await client.list_open(d2[0])] == [t2]
        assert {t1, t2} <= {t.transfer_id for t in await client.list_open()}
        for rid, tid, dst in ((r1, t1, d1), (r2, t2, d2)):
            assert (await client.abort(rid, tid, 1, *dst, reason="cleanup")).ok

    run(directory.address, scenario)


# ---- prefix index, route epoch, nonces -------------------------------------


def test_route_epoch_and_nonce(directory):
    async def scenario(client: Callers):
        before = await client.get_route_epoch()
        adv = await client.advance_route_epoch(reason="test")
        assert adv.advanced and adv.route_epoch > before
        first = adv.route_epoch
        second = await client.advance_route_epoch(expected=first)
        assert second.advanced and second.route_epoch > first
        # expected is never 0 here (0 means unconditional on the wire).
        stale = await client.advance_route_epoch(expected=first, reason="lost race")
        assert (stale.route_epoch, stale.advanced) == (second.route_epoch, False)
        assert await client.get_route_epoch() == second.route_epoch

        src, dst = await two_workers(client)
        old = await client.reserve(manifest(src, dst, uid("t"), uid("r"), route_epoch=first))
        assert old.outcome == Outcome.STALE_GENERATION  # routed under a superseded epoch

        # A nonce is consumed by the destination of the transfer its capability names; before
        # the router recorded that transfer the answer is "not recorded", and nothing is burned.
        rid, tid = uid("r"), uid("t")
        nonce, expires_ms = uuid.uuid4().hex, int(time.time() * 1000) + 30_000
        with pytest.raises(TransferNotRecorded, match=tid):
            await client.worker(dst[0]).consume_nonce(nonce, expires_ms, transfer_id=tid)
        assert (await client.reserve(manifest(src, dst, tid, rid))).ok
        with pytest.raises(grpc.aio.AioRpcError, match="not the destination"):  # another decode may not
            await client.as_("decode", "decode-other").consume_nonce(nonce, expires_ms, transfer_id=tid)
        assert await client.worker(dst[0]).consume_nonce(nonce, expires_ms, transfer_id=tid)
        assert not await client.worker(dst[0]).consume_nonce(nonce, expires_ms, transfer_id=tid)  # replay
        assert (await client.abort(rid, tid, 1, *dst, reason="test done")).ok

    run(directory.address, scenario)


# ---- bad input --------------------------------------------------------------

def test_bad_input_is_invalid_argument(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        with pytest.raises(ValueError, match="manifest.transfer_id"):
            await client.reserve(manifest(src, dst, "", uid("r")))
        with pytest.raises(ValueError, match="manifest.generation"):
            await client.reserve(manifest(src, dst, uid("t"), uid("r"), gen=0))
        with pytest.raises(ValueError, match="generation"):
            await client.begin(uid("r"), uid("t"), 0, *dst)
        with pytest.raises(ValueError, match="worker_id"):
            await client.begin(uid("r"), uid("t"), 1, "", 1)
        with pytest.raises(ValueError, match="request_id"):
            await client.abort("", uid("t"), 1, *dst)
        with pytest.raises(ValueError, match="transfer_id"):
            await client.lookup(uid("r"), "")
        with pytest.raises(ValueError, match="epoch"):
            await client.heartbeat(dst[0], 0)
        with pytest.raises(ValueError, match="expires_unix_ms"):
            await client.worker(dst[0]).consume_nonce("n", 0)

        # Enum values the client cannot send, straight through the stub (as callers the
        # methods admit: a worker registering itself, the router reading).
        worker, router = (pki.security(role, name).aio_channel(client.address, "directory")
                          for role, name in (("decode", "w"), ("router", "router")))
        async with worker, router:
            for call, request in [
                (directory_pb2_grpc.DirectoryStub(worker).RegisterWorker,
                 directory_pb2.RegisterWorkerRequest(worker_id="w")),  # role unset
                (directory_pb2_grpc.DirectoryStub(worker).RegisterWorker,
                 directory_pb2.RegisterWorkerRequest(worker_id="w", role=42)),
                (directory_pb2_grpc.DirectoryStub(router).ClusterSnapshot,
                 directory_pb2.ClusterSnapshotRequest(role=42)),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call(request, timeout=5)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "role" in err.value.details()

    run(directory.address, scenario)


# ---- failures: lease expiry, Redis down ------------------------------------

def test_lease_expiry_reaps_without_traffic(redis_server):
    directory = DirectoryProcess(redis_server.url, PD_LEASE_TTL_S="1")
    raw = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        async def scenario(client: Callers):
            src, dst = await two_workers(client)
            rid, tid = uid("r"), uid("t")
            assert (await client.reserve(manifest(src, dst, tid, rid))).ok
            # No more calls to the directory: only its reaper can expire the leases.
            # Raw Redis reads do not run the directory's lazy sweep.
            key = f"{directory.prefix}:txn:{tid}"
            deadline = time.monotonic() + 10  # both leases reaped (one may lapse a beat later)
            while (raw.hget(key, "state") != str(int(TxnState.ABORTED))
                   or raw.zrange(f"{directory.prefix}:leases", 0, -1)) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert raw.hget(key, "state") == str(int(TxnState.ABORTED)), raw.hgetall(key)
            assert raw.hget(key, "abort_reason") == "lease_expired"
            assert raw.zrange(f"{directory.prefix}:leases", 0, -1) == []

            assert (await client.snapshot()).workers == ()
            rec = await client.lookup(rid, tid)
            assert (rec.state, rec.abort_reason) == (TxnState.ABORTED, "lease_expired")
            assert not (await client.heartbeat(*dst)).ok  # the worker must re-register
            late = await client.begin(rid, tid, 1, *src)
            assert (late.outcome, late.state) == (Outcome.LEASE_LOST, TxnState.ABORTED)
            again = await client.register_worker(WorkerInfo(dst[0], "decode", "h:1", "h:2", "abi", CAP))
            assert again.epoch > dst[1]
            assert [w.worker_id for w in (await client.snapshot()).workers] == [dst[0]]

        run(directory.address, scenario)
    finally:
        raw.close()
        assert directory.stop() == 0, directory.output()
    assert "reaper: reaped" in directory.output()


def test_redis_down_is_unavailable_not_a_hang():
    with start_redis() as own_redis:
        directory = DirectoryProcess(own_redis.url, PD_REDIS_TIMEOUT_S="0.5", PD_REDIS_RETRIES="1")
        try:
            async def scenario(client: Callers):
                src, dst = await two_workers(client)
                own_redis.stop()
                for call in (client.snapshot, lambda: client.heartbeat(*dst),
                             lambda: client.reserve(manifest(src, dst, uid("t"), uid("r"))),
                             lambda: client.begin(uid("r"), uid("t"), 1, *dst), client.list_open):
                    started = time.monotonic()
                    with pytest.raises(DirectoryUnavailable, match="UNAVAILABLE"):
                        await call()
                    assert time.monotonic() - started < 3.0

            async def main():
                client = Callers(directory.address)
                try:
                    await scenario(client)
                finally:
                    await client.close()

            asyncio.run(main())  # no leak check possible: the store is gone (nothing was reserved)
        finally:
            assert directory.stop() == 0, directory.output()
    # With the directory itself gone, the client fails fast too.
    async def gone():
        async with DirectoryClient(directory.address, 2.0, pki.security("router", "router")) as client:
            with pytest.raises(DirectoryUnavailable):
                await client.get_route_epoch()

    asyncio.run(gone())


# ---- graceful leave and readiness (issue 19) ----------------------------------

def test_a_worker_deregisters_itself_and_leaves_at_once(directory):
    async def scenario(client: Callers):
        src, dst = await two_workers(client)
        rid, tid = uid("r"), uid("t")
        assert (await client.reserve(manifest(src, dst, tid, rid))).ok
        # Another worker's certificate may not deregister it.
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await client.worker(src[0]).deregister_worker(dst[0], dst[1])
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert dst[0] in {w.worker_id for w in (await client.snapshot()).workers}
        # A stale epoch leaves nothing.
        assert not await client.worker(dst[0]).deregister_worker(dst[0], dst[1] + 1)
        assert await client.worker(dst[0]).deregister_worker(*dst)
        # Gone now, not after the 10 s lease: its open transaction aborted with it.
        assert dst[0] not in {w.worker_id for w in (await client.snapshot()).workers}
        rec = await client.lookup(rid, tid)
        assert (rec.state, rec.abort_reason) == (TxnState.ABORTED, "worker_deregistered")
        assert not (await client.heartbeat(*dst)).ok
        assert not await client.worker(dst[0]).deregister_worker(*dst)  # already gone: idempotent
        assert await client.worker(src[0]).deregister_worker(*src)

    run(directory.address, scenario)


def _status(address: str, service: str = "") -> str:
    with pki.security("operator", "operator").channel(address, "directory") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                              timeout=1)
        except grpc.RpcError as e:
            return e.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def _wait_status(address: str, want: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := _status(address)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got == want


def test_the_directory_is_not_ready_while_redis_is_unreachable():
    own_redis = start_redis()
    port = own_redis.port
    directory = DirectoryProcess(own_redis.url, PD_LEASE_TTL_S="1", PD_REDIS_TIMEOUT_S="0.5",
                                 PD_REDIS_RETRIES="1")
    again = None
    try:
        assert _status(directory.address) == _status(directory.address, SERVICE) == "SERVING"
        own_redis.stop()
        _wait_status(directory.address, "NOT_SERVING")
        assert _status(directory.address, SERVICE) == "NOT_SERVING"
        again = start_redis(port)
        _wait_status(directory.address, "SERVING")
        assert _status(directory.address, SERVICE) == "SERVING"
        run(directory.address, lambda client: asyncio.sleep(0))  # answers again; nothing left open
    finally:
        assert directory.stop() == 0, directory.output()
        own_redis.stop()
        if again is not None:
            again.stop()
    assert "store reachable again" in directory.output()
