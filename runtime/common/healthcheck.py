"""A gRPC health probe over mutual TLS, for Kubernetes exec probes.

    python -m runtime.common.healthcheck --address 127.0.0.1:50080 --service router

Kubernetes' native `grpc:` probe speaks plaintext or server-only TLS and cannot present
a client certificate, and every pdserve port requires one. So the chart's probes run
this inside the container: it presents the pod's own certificate (PD_TLS_CERT/KEY/CA,
or plaintext under PD_INSECURE=1), checks that the server holds a certificate for
`--service` (its DNS name <service>.pdserve.internal), asks grpc.health.v1 Check for the
overall status ("") and exits 0 only on SERVING. A worker says SERVING only once it is
registered in the directory with a live lease and its kernels passed their self-check,
so a Ready worker pod can take a hand-off.

`--alive` (the liveness probe) accepts any answer: a worker whose lease lapsed while
Redis failed over is NOT_SERVING (not Ready) but alive, and restarting it would only
lose its model load; only a process that does not answer at all is restarted.

Exit codes: 0 SERVING (`--alive`: any answer), 1 not serving or no answer (the reason on stderr), 2 bad
configuration (no certificate files).
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve_client import tls

SERVICES = ("router", "directory", "prefill", "decode", "collector")
"""What a probe may name: the services whose DNS names server certificates carry
(a mixed worker answers as decode and prefill)."""


def check(address: str, service: str, timeout_s: float, files: tls.TlsFiles | None,
          alive: bool = False) -> tuple[bool, str]:
    """(SERVING? -- or with `alive`, answered at all? --, the status name or the error) of the
    server at `address`."""
    with tls.channel(address, files, service) as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""),
                                                        timeout=timeout_s)
        except grpc.RpcError as e:
            return False, f"{e.code().name}: {e.details()}"
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return alive or resp.status == health_pb2.HealthCheckResponse.SERVING, name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.common.healthcheck", description=__doc__.split("\n")[0])
    ap.add_argument("--address", required=True, help="host:port of the gRPC server")
    ap.add_argument("--service", required=True, choices=SERVICES, help="what the server answers as")
    ap.add_argument("--timeout", type=float, default=3.0, help="seconds for the answer (default 3)")
    ap.add_argument("--alive", action="store_true", help="any answer will do (liveness), not only SERVING")
    args = ap.parse_args(argv)
    try:
        files = tls.resolve(identity="operator")
    except (tls.TlsConfigError, OSError) as e:
        print(f"healthcheck: {e}", file=sys.stderr)
        return 2
    ok, status = check(args.address, args.service, args.timeout, files, args.alive)
    if not ok:
        print(f"healthcheck: {args.service} at {args.address}: {status}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
