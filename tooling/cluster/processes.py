"""Waiting on the local cluster's processes: health (gRPC health SERVING) and liveness."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtime.common.liveness import process_running
from runtime.security.tls import Security


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


BIND_FAILED = (b"Address already in use", b"Failed to bind to address")
"""What a service's log says when its port was taken (Python's OSError; gRPC's)."""


class PortTaken(RuntimeError):
    """A service exited while starting because one of its ports was taken."""


def start_failure(name: str, cause: Exception, log: Path, log_from: int) -> RuntimeError:
    """The error for service `name` that exited while starting (`cause`, from wait_healthy):
    the last line its log gained since byte `log_from` says why; PortTaken when a bind failed."""
    with open(log, "rb") as f:
        f.seek(log_from)
        text = f.read()
    lines = [line.strip() for line in text.decode(errors="replace").splitlines() if line.strip()]
    kind = PortTaken if any(marker in text for marker in BIND_FAILED) else RuntimeError
    return kind(f"{name}: {cause}: {lines[-1] if lines else 'its log says nothing'} (log {log})")


def pid_alive(pid: int, popen: subprocess.Popen | None = None) -> bool:
    """Is `pid` running (not exited, not a zombie)?"""
    if popen is not None:
        return popen.poll() is None
    return process_running(pid)
