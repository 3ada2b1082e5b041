"""Where each process of the local cluster serves /metrics (`pdserve up`).

Every pdserve process gets its own loopback port, passed as `--metrics-listen` on its
command line (so `LocalCluster.restart` brings it back on the same URL), and its URL is
recorded in cluster.json as the process's `metrics_url`. With security on the URL is
HTTPS and a scraper presents the `operator` or the `monitor` certificate the launcher
writes beside the others (runtime/telemetry/endpoint.py); insecure, plain HTTP.
`pdserve up` prints the curl command that scrapes one of them so.
"""

from __future__ import annotations

import shlex

from .ports import free_port

MONITOR_CERT = "monitor"
"""File stem of the scraper's certificate in the TLS dir (role monitor)."""


def metrics_endpoint(insecure: bool) -> tuple[list[str], str]:
    """(the flags that give a process a /metrics port, the URL it will answer on)."""
    listen = f"127.0.0.1:{free_port()}"
    return ["--metrics-listen", listen], f"{'http' if insecure else 'https'}://{listen}/metrics"


def metrics_lines(procs) -> list[str]:
    """One line per process with a metrics URL, for `pdserve up`."""
    return [f"  {p.name:<10} metrics {p.metrics_url}" for p in procs if getattr(p, "metrics_url", "")]


def curl_command(url: str, tls_dir: str | None) -> str:
    """The curl command that scrapes `url` as the monitor (with `tls_dir`'s CA and
    monitor certificate; None: an insecure cluster's plain HTTP)."""
    if tls_dir is None:
        return f"curl {url}"
    files = [f"{tls_dir.rstrip('/')}/{name}" for name in ("ca.crt", f"{MONITOR_CERT}.crt", f"{MONITOR_CERT}.key")]
    return "curl --cacert {} --cert {} --key {} {}".format(*map(shlex.quote, files), url)
