"""The directory process's liveness, as a real process on a real redis-server: it will
not start without Redis, reaps expired leases with no traffic, answers UNAVAILABLE (not a
hang) while Redis is down and is NOT_SERVING until Redis is back, and lets a worker
deregister itself at once (its open transactions abort with it)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtime.directory.client import DirectoryClient
from runtime.directory.records import DirectoryUnavailable, WorkerInfo
from runtime.directory.states import Outcome, TxnState
from tests.support import pki
from tests.support.directory.grpc_process import (
    CAP,
    ROOT,
    SERVICE,
    Callers,
    DirectoryProcess,
    manifest,
    run,
    two_workers,
    uid,
)
from tooling.cluster.ports import free_port
from tooling.cluster.redis_proc import start_redis


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


# ---- graceful leave and readiness (docs/design.md, Processes and what each owns)

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
