"""/metrics over HTTPS (runtime/telemetry/endpoint.py), on a real socket with
certificates from a throwaway CA: operator and monitor read, any other role gets 403,
no certificate fails the handshake; insecure it is plain HTTP; OpenMetrics on request."""

from __future__ import annotations

import ssl
import urllib.error

import pytest

from runtime.security.tls import Security
from runtime.telemetry.catalog import WorkerMetrics
from runtime.telemetry.endpoint import serve_metrics
from tests.support import pki
from tests.support.metrics import Scrape, scrape, tls_context


@pytest.fixture(scope="module")
def secure():
    metrics = WorkerMetrics()
    metrics.denied("tenant")
    server = serve_metrics("127.0.0.1:0", metrics.registry, pki.security("decode", "decode-0"))
    yield server
    server.close()


@pytest.mark.parametrize("role", ["operator", "monitor"])
def test_operator_and_monitor_read(secure, role):
    assert secure.url.startswith("https://127.0.0.1:")
    m = Scrape(scrape(secure.url, pki.security(role, "ops")))
    assert m.value("pd_capability_denials_total", reason="tenant") == 1
    assert "process_cpu_seconds" in m.families  # the standard collectors are there too


@pytest.mark.parametrize("role,name", [("client", "acme"), ("decode", "decode-1"), ("router", "router")])
def test_other_roles_get_403(secure, role, name):
    with pytest.raises(urllib.error.HTTPError) as err:
        scrape(secure.url, pki.security(role, name))
    assert err.value.code == 403
    assert f"{role}/{name} may not read metrics" in err.value.read().decode()


def test_no_certificate_fails_the_handshake(secure):
    ca_only = tls_context(None, trust=pki.security("operator", "ops"))
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        scrape(secure.url, context=ca_only)
    assert Scrape(scrape(secure.url, pki.security("operator", "ops"))).families  # still serving


def test_openmetrics_when_asked(secure):
    text = scrape(secure.url, pki.security("monitor", "prom"), openmetrics=True)
    assert text.rstrip().endswith("# EOF")
    m = Scrape(text, openmetrics=True)
    assert m.value("pd_capability_denials_total", reason="tenant") == 1


def test_insecure_is_plain_http_for_anyone():
    server = serve_metrics("127.0.0.1:0", WorkerMetrics().registry, Security.insecure())
    try:
        assert server.url.startswith("http://")
        assert "pd_free_blocks" in Scrape(scrape(server.url)).families
    finally:
        server.close()


def test_no_listen_address_no_endpoint():
    assert serve_metrics("", WorkerMetrics().registry, Security.insecure()) is None
