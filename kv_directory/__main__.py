"""``python -m kv_directory [--listen HOST:PORT] [--redis-url URL]``

Serves pd.v1.Directory until SIGTERM/SIGINT (exit 0). Flags override
``DirectoryConfig.from_env()`` (``PD_*`` variables). Exits 2 with a one-line
message if the configuration is invalid and 3 if Redis cannot be reached at
start: a directory that cannot vouch for its answers does not start serving.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from kv_directory.access import ACCESS, SERVICE_NAME
from kv_directory.config import DirectoryConfig
from kv_directory.redis_store import RedisDirectoryStore
from kv_directory.server import DirectoryServicer
from kv_directory.store import DirectoryStore
from pdserve_client.rpc.pd.v1 import directory_pb2_grpc
from runtime.common.grpc_server import setup_logging, start_server, wait_for_shutdown
from runtime.common.heap import freeze_startup_heap
from runtime.directory.records import DirectoryUnavailable
from runtime.security.capability import Verifier
from runtime.security.config import CapabilitySettings, verifier
from runtime.security.tls import Security
from runtime.telemetry import tracing
from runtime.telemetry.endpoint import serve_metrics

log = logging.getLogger("kv_directory")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags; unset flags leave the env/default value."""
    p = argparse.ArgumentParser(prog="python -m kv_directory", description=__doc__.splitlines()[0])
    p.add_argument("--listen", help="gRPC listen address host:port (port 0 = any); env PD_DIRECTORY_LISTEN")
    p.add_argument("--redis-url", help="redis:// URL of the state store; env PD_REDIS_URL")
    p.add_argument("--log-level", help="logging level; env PD_LOG_LEVEL, default INFO")
    p.add_argument("--metrics-listen", help="/metrics host:port; env PD_METRICS_LISTEN, default off")
    return p.parse_args(argv)


def capability_verifier(security: Security) -> Verifier | None:
    """With TLS on and PD_CAPABILITY_PUBLIC_KEYS set, the routers' capabilities name the
    destination that may consume their nonce (else the transfer's record does); ValueError
    when the key set cannot be read."""
    settings = CapabilitySettings.from_env()
    return verifier(settings, security) if security.secure and settings.public_keys else None


async def serve(store: DirectoryStore, config: DirectoryConfig, security: Security,
                caps: Verifier | None = None) -> None:
    """Serve pd.v1.Directory (plus health and reflection) on ``config.listen_addr``
    until SIGTERM/SIGINT, then drain and close the store."""
    servicer = DirectoryServicer(store, config, security, caps)
    server, port, health = await start_server(
        config.listen_addr, [(directory_pb2_grpc.add_DirectoryServicer_to_server, servicer, SERVICE_NAME)],
        security, ACCESS)
    servicer.start(health.ready)
    metrics = serve_metrics(config.metrics_listen, servicer.metrics.registry, security)
    host = config.listen_addr.rpartition(":")[0] or "0.0.0.0"
    log.info("directory serving on %s:%d (redis %s, lease %.3gs, nonce destinations by %s)",
             host, port, config.describe_redis(), config.lease_ttl_s,
             "capability" if caps is not None else "record")
    freeze_startup_heap()
    try:
        await wait_for_shutdown(server, health, on_stop=servicer.stop_reaper)
    finally:
        await servicer.close()
        if metrics is not None:
            metrics.close()
    log.info("directory stopped")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    args = parse_args(argv)
    overrides = {k: v for k, v in (("listen_addr", args.listen), ("redis_url", args.redis_url),
                                   ("log_level", args.log_level), ("metrics_listen", args.metrics_listen)) if v}
    try:
        config = DirectoryConfig.from_env(**overrides)
    except ValueError as exc:
        print(f"kv_directory: bad configuration: {exc}", file=sys.stderr)
        return 2
    setup_logging("kv_directory", config.log_level)
    try:
        security = Security.from_env("kv_directory")
        caps = capability_verifier(security)
    except ValueError as exc:
        print(f"kv_directory: bad configuration: {exc}", file=sys.stderr)
        return 2
    tracing.configure("directory", "directory", files=security.files)
    store = RedisDirectoryStore(config)
    try:
        store.ping()
    except DirectoryUnavailable as exc:
        store.close()
        print(f"kv_directory: redis unreachable at {config.describe_redis()}: {exc}", file=sys.stderr)
        return 3
    try:
        asyncio.run(serve(store, config, security, caps))
    except OSError as exc:  # cannot bind the listen address
        print(f"kv_directory: cannot serve on {config.listen_addr}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
