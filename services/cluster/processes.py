"""Waiting on the local cluster's processes: health (gRPC health SERVING) and liveness."""

from __future__ import annotations

import subprocess
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.liveness import process_running
from services.security.tls import Security


def wait_healthy(address: str, timeout_s: float, proc: subprocess.Popen | None = None,
                 security: Security | None = None, service: str = "router") -> None:
    """Block until `address` answers gRPC health SERVING (or raise with the reason);
    `security` is the identity asking (an operator's), `service` what answers there."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    with (security or Security.insecure()).channel(address, service) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"process for {address} exited with {proc.returncode}")
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            except grpc.RpcError as e:
                last = e.code().name
            time.sleep(0.1)
    raise TimeoutError(f"{address} not healthy after {timeout_s:.0f}s ({last})")


def pid_alive(pid: int, popen: subprocess.Popen | None = None) -> bool:
    """Is `pid` running (not exited, not a zombie)?"""
    if popen is not None:
        return popen.poll() is None
    return process_running(pid)
