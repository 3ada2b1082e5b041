"""The local cluster's traces: `LocalCluster.up` starts the project's OTLP collector
(runtime/telemetry/collector.py) as its own process, first after Redis, and points
every other process at it with the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; spans
land in `<state dir>/traces/spans.jsonl`, where `pdctl trace` reads them.

`ClusterSpec.otlp_endpoint` sends them elsewhere instead (Jaeger, Tempo, Phoenix: see
docs/observability.md) and `ClusterSpec.traces=False` turns tracing off.
"""

from __future__ import annotations

from pdserve_client.spans import SPANS_FILE
from runtime.common.private_files import private_dir

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
NAME = "collector"


def start(cluster, timeout_s: float) -> str:
    """Start `cluster`'s (a LocalCluster) local collector unless the spec says otherwise; the endpoint every
    process exports to ('' = tracing off)."""
    spec = cluster.spec
    if spec.otlp_endpoint or not spec.traces:
        return spec.otlp_endpoint
    spans = cluster.state / SPANS_FILE
    private_dir(spans.parent)
    spans.unlink(missing_ok=True)  # a fresh cluster's traces only
    cluster._issue(NAME, "collector")
    address = cluster._service(NAME, "runtime.telemetry.collector", ["--out", str(spans)], timeout_s,
                                metrics=False)
    # Plaintext only for an insecure cluster; otherwise mutual TLS with the collector's certificate.
    return f"http://{address}" if spec.insecure else address


def env_for(cluster, name: str) -> dict[str, str]:
    """The tracing variables of process `name` (the collector exports nothing)."""
    if not cluster.otlp_endpoint or name in (NAME, "redis"):
        return {}
    # A local trace is read a moment after its request (pdctl trace): batches leave every
    # 0.5 s here, not the SDK's 5 s default.
    return {ENDPOINT_ENV: cluster.otlp_endpoint, "OTEL_BSP_SCHEDULE_DELAY": "500"}
