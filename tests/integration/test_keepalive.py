"""The router's keepalive on its worker connections (router/grpc_gateway.py CHANNEL_OPTIONS,
runtime/common/grpc_server.py PING_OPTIONS), with real gRPC between two processes: a
server that stops (SIGSTOP) has its open call fail UNAVAILABLE a few seconds later, long
before any lease would lapse; a server whose Python holds the GIL for seconds answers the
pings all the same (gRPC's own threads do) and its call stays open."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router.grpc_gateway import CHANNEL_OPTIONS, KEEPALIVE_S, PING_TIMEOUT_S
from tooling.cluster.ports import free_port

SERVER = r"""
import asyncio, sys, threading, time
import grpc
from grpc_health.v1 import health, health_pb2_grpc
from runtime.common.grpc_server import PING_OPTIONS

def hog(seconds):  # pure Python: holds the GIL the whole time
    time.sleep(1.0)
    until = time.time() + seconds
    while time.time() < until:
        pass

async def main(port, hog_s):
    server = grpc.aio.server(options=PING_OPTIONS)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("up", flush=True)
    if hog_s:
        threading.Thread(target=hog, args=(hog_s,), daemon=True).start()
    await server.wait_for_termination()

asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
"""


async def watch(port: int, then, within_s: float):
    """Open a Watch call, run `then()`, and read on: (seconds until the call failed, its
    error) or (None, None) if it was still open `within_s` later."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as ch:
        call = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""))
        await call.read()
        then()
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(within_s):
                await call.read()
        except TimeoutError:
            return None, None
        except grpc.aio.AioRpcError as e:
            return time.monotonic() - t0, e
        finally:
            call.cancel()
    raise AssertionError("the Watch call ended by itself")


@pytest.fixture
def server():
    procs = []

    def start(hog_s: float = 0.0) -> tuple[int, subprocess.Popen]:
        port = free_port()
        p = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(hog_s)], stdout=subprocess.PIPE,
                             cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()})
        procs.append(p)
        assert p.stdout.readline().strip() == b"up"
        return port, p

    yield start
    for p in procs:
        p.send_signal(signal.SIGCONT)
        p.kill()
        p.wait(10)


def test_a_frozen_server_fails_its_open_call_within_the_keepalive(server):
    port, p = server()
    took_s, error = asyncio.run(watch(port, lambda: p.send_signal(signal.SIGSTOP), within_s=30))
    assert error is not None and error.code() is grpc.StatusCode.UNAVAILABLE, error
    assert took_s < KEEPALIVE_S + PING_TIMEOUT_S + 1.5, took_s


def test_a_server_busy_holding_the_gil_keeps_its_call(server):
    port, _ = server(hog_s=2 * (KEEPALIVE_S + PING_TIMEOUT_S))
    took_s, error = asyncio.run(watch(port, lambda: None, within_s=3 * (KEEPALIVE_S + PING_TIMEOUT_S)))
    assert error is None, f"failed after {took_s:.1f} s: {error}"
