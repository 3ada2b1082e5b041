"""Scraping a process's /metrics as a given identity, parsed with prometheus_client.

    text = scrape(cluster.procs["router"].metrics_url, security)     # Security of any identity
    m = Scrape(text)
    m.value("pd_route_total", policy="disaggregated", topology="disaggregated", result="ok")

`scrape_process(cluster, "decode-0")` does both with the operator's certificate.
"""

from __future__ import annotations

import ssl
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from runtime.security.tls import Security

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def tls_context(security: Security | None, trust: Security | None = None) -> ssl.SSLContext | None:
    """A client context presenting `security`'s certificate; with `security` None and
    `trust` given, one that trusts the CA but presents nothing (None: plain HTTP)."""
    if security is not None and security.secure:
        return security.client_ssl()
    if trust is not None and trust.secure:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cadata=trust.files.ca.decode())
        return ctx
    return None


def scrape(url: str, security: Security | None = None, openmetrics: bool = False, timeout_s: float = 10.0,
           context: ssl.SSLContext | None = None) -> str:
    """The body of GET `url` (urllib.error.HTTPError on 403; an SSL or connection error
    when the handshake is refused). `openmetrics` asks for the OpenMetrics format."""
    req = urllib.request.Request(url, headers={"Accept": OPENMETRICS} if openmetrics else {})
    ctx = context if context is not None else tls_context(security)
    with urllib.request.urlopen(req, timeout=timeout_s, context=ctx) as resp:
        return resp.read().decode()


class Scrape:
    """One exposition, parsed: families by name, and sample values by name and labels."""

    def __init__(self, text: str, openmetrics: bool = False):
        parse = openmetrics_families if openmetrics else text_string_to_metric_families
        self.families = {f.name: f for f in parse(text)}

    def samples(self, name: str) -> list:
        """Every sample called `name` (pd_route_total, pd_ttft_seconds_count, ...)."""
        return [s for f in self.families.values() for s in f.samples if s.name == name]

    def as_dict(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """{(sample name, sorted labels): value} of every sample."""
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in self.families.values() for s in f.samples}

    def value(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples whose labels include `labels` (0 when none)."""
        return sum(s.value for s in self.samples(name) if labels.items() <= s.labels.items())


def scrape_process(cluster, name: str, identity: str = "operator", openmetrics: bool = False) -> Scrape:
    """Scrape service `name` of a LocalCluster presenting certificate `identity`."""
    text = scrape(cluster.procs[name].metrics_url, cluster.identity(identity), openmetrics)
    return Scrape(text, openmetrics)
