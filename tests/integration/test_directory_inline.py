"""The directory's hand-off calls made inline on its event loop (kv_directory/store_calls.py),
as a real process on a real redis-server that stalls: SIGSTOP makes Redis take every call
and answer none until SIGCONT.

While Redis stalls, the inline twin gives up after its budget and the call is made again
on the pool, so the event loop keeps serving (a health check answers at once), and the
call answers as it would have: the reserve APPLIED (its first run, cut off by the
twin's timeout, ran once Redis woke), the nonce consumed once and a replay refused.
The pd_directory_store_inline_calls_total counter says what happened."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtime.directory.states import Outcome, TxnState
from tests.support import pki
from tests.support.directory.grpc_process import (
    SERVICE,
    Callers,
    DirectoryProcess,
    drive_to,
    manifest,
    two_workers,
    uid,
)
from tests.support.metrics import Scrape, scrape
from tooling.cluster.ports import free_port
from tooling.cluster.redis_proc import start_redis

BUDGET_S = 0.05
STALL_S = 0.6


def _inline_calls(metrics_url: str) -> dict[str, float]:
    m = Scrape(scrape(metrics_url, pki.security("operator", "operator")))
    return {o: m.value("pd_directory_store_inline_calls_total", outcome=o) or 0.0
            for o in ("answered", "slow", "unavailable")}


async def _warmed_up(directory: DirectoryProcess, url: str):
    """A caller of `directory` and its two workers after three hand-offs (a probe on the
    pool, then inline), or None when a twin's answer came slower than its budget (a busy
    host): the directory is then cooling off with every call on the pool, and the stall
    below would not test the inline path."""
    client = Callers(directory.address)
    src, dst = await two_workers(client)
    for _ in range(3):
        rid, tid = uid("r"), uid("t")
        assert (await client.reserve(manifest(src, dst, tid, rid))).outcome == Outcome.APPLIED
        await drive_to(client, rid, tid, 1, src, dst, TxnState.PUBLISHED)
        assert (await client.release(rid, tid, 1, *dst)).ok
    before = _inline_calls(url)
    assert before["answered"] >= 2 and before["unavailable"] == 0, before
    if before["slow"]:
        await client.close()
        return None
    return client, src, dst


def test_a_stalled_redis_sends_the_calls_back_to_the_pool_and_nothing_is_lost():
    redis_server = start_redis()
    try:
        for _ in range(3):  # a fresh directory (out of its cool-off) if the host was too busy
            metrics = f"127.0.0.1:{free_port()}"
            directory = DirectoryProcess(redis_server.url, PD_STORE_INLINE_BUDGET_S=str(BUDGET_S),
                                         PD_STORE_INLINE_COOL_OFF_S="30", PD_METRICS_LISTEN=metrics)
            try:
                if asyncio.run(_stall(directory, redis_server, f"https://{metrics}/metrics")):
                    return
            finally:
                directory.stop()
        raise AssertionError("three directories in a row answered slower than their budget before any stall")
    finally:
        redis_server.stop()


async def _stall(directory: DirectoryProcess, redis_server, url: str) -> bool:
    """The scenario; False when the directory never got past its warm-up inline."""
    ready = await _warmed_up(directory, url)
    if ready is None:
        return False
    client, src, dst = ready
    try:
        rid, tid = uid("r"), uid("t")
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        try:
            reserving = asyncio.ensure_future(client.reserve(manifest(src, dst, tid, rid)))
            await asyncio.sleep(BUDGET_S * 4)
            with pki.security("operator", "operator").channel(directory.address, "directory") as ch:
                started = time.monotonic()
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5)
                answered_in = time.monotonic() - started
            await asyncio.sleep(STALL_S)
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        reserved = await reserving
        assert answered_in < STALL_S / 2, f"the event loop waited {answered_in:.2f}s on a stalled Redis"
        assert reserved.outcome == Outcome.APPLIED, reserved  # not DUPLICATE: its own first run
        after = _inline_calls(url)
        assert after["unavailable"] == 1, after

        nonce = os.urandom(16).hex()
        expires = int(time.time() * 1000) + 30_000
        assert await client.worker(dst[0]).consume_nonce(nonce, expires, tid)  # cooling off: pooled
        assert not await client.worker(dst[0]).consume_nonce(nonce, expires, tid)  # a replay
        await drive_to(client, rid, tid, 1, src, dst, TxnState.PUBLISHED)
        assert (await client.release(rid, tid, 1, *dst)).ok
        assert await client.list_open() == []
        assert _inline_calls(url) == after  # the cool-off kept them all on the pool
        return True
    finally:
        await client.close()
