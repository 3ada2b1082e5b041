"""The observed load (autoscaler/observe.py) from real router expositions: RouterMetrics
counting completed requests, rendered by prometheus_client and served by the real /metrics
endpoint over mutual TLS. Rates and length mixes are the increase over the window; a router
that restarted counts from zero; a router that fails is named; the monitor certificate
reads and a client's does not."""

from __future__ import annotations

import math

import pytest
from prometheus_client import generate_latest

from autoscaler.observe import Observer, TokenHistogram, parse_reading, scrape
from runtime.telemetry.catalog import TOKEN_BUCKETS, RouterMetrics
from runtime.telemetry.endpoint import serve_metrics
from tests.support import pki


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def complete(m: RouterMetrics, prompt: int, output: int, n: int = 1) -> None:
    for _ in range(n):
        m.completed("gold", prompt, ttft_s=0.1, tpot_s=0.01, num_tokens=output, slo_ttft_s=0, slo_tpot_s=0)


def observer(routers: dict[str, RouterMetrics], clock: Clock, window_s: float = 60.0) -> Observer:
    def fetch(url, context):
        if routers[url] is None:
            raise OSError("connection refused")
        return generate_latest(routers[url].registry).decode()
    return Observer(lambda: sorted(routers), None, window_s, fetch=fetch, clock=clock)


def start(obs: Observer) -> None:
    """The first reading of each router only starts the window."""
    with pytest.raises(RuntimeError, match="first reading"):
        obs.observe()


def test_the_histograms_span_1_to_32768_tokens_and_parse_back():
    assert TOKEN_BUCKETS[0] == 1 and TOKEN_BUCKETS[-1] == 32768
    m = RouterMetrics()
    complete(m, 1000, 200, n=3)
    complete(m, 40000, 1)
    r = parse_reading(generate_latest(m.registry).decode(), 5.0)
    assert r.count == 4 and r.prompt.edges[-1] == math.inf
    assert r.prompt.counts[r.prompt.edges.index(1024.0)] == 3 and r.prompt.counts[-1] == 1
    assert r.output.counts[r.output.edges.index(256.0)] == 3 and r.output.counts[0] == 1
    with pytest.raises(ValueError, match="no pd_request_prompt_tokens"):
        parse_reading("# empty\n", 0)


def test_rate_and_mix_are_the_increase_over_the_window_summed_over_routers():
    a, b, clock = RouterMetrics(), RouterMetrics(), Clock()
    complete(a, 100, 10, n=50)  # before the window: not part of the load
    obs = observer({"a": a, "b": b}, clock)
    start(obs)
    clock.now += 10
    complete(a, 1000, 200, n=20)
    complete(b, 3000, 50, n=10)
    load = obs.observe()
    assert load.routers == 2 and load.requests == 30 and load.window_s == 10
    assert load.rate_rps == pytest.approx(3.0)
    assert load.prompt_tokens.quantile(0.5) == 1024 and load.prompt_tokens.quantile(0.9) == 4096
    assert load.output_tokens.quantile(0.5) == 256 and load.output_tokens.quantile(0.3) == 64
    assert "3.00 rps over 10 s (30 requests, 2 router(s)) at p50/p90 prompt 1024/4096" in load.describe()


def test_old_readings_leave_the_window():
    a, clock = RouterMetrics(), Clock()
    obs = observer({"a": a}, clock, window_s=30)
    start(obs)
    for _ in range(6):  # 10 requests every 10 s, then a quiet minute
        complete(a, 500, 50, n=10)
        clock.now += 10
        load = obs.observe()
    assert (load.rate_rps, load.window_s, load.requests) == (1.0, 30, 30)  # the last 30 s only
    clock.now += 60
    load = obs.observe()  # the reading at or before the window's start is 60 s old
    assert (load.rate_rps, load.window_s) == (0.0, 60)


def test_a_restarted_router_counts_from_zero_and_a_failing_one_is_left_out():
    routers, clock = {"a": RouterMetrics(), "b": RouterMetrics()}, Clock()
    complete(routers["a"], 100, 10, n=40)
    obs = observer(routers, clock)
    start(obs)
    routers["a"] = RouterMetrics()  # restarted: its counters start again
    complete(routers["a"], 100, 10, n=5)
    routers["b"] = None
    clock.now += 5
    load = obs.observe()
    assert load.requests == 5 and load.routers == 1
    routers["a"] = None
    with pytest.raises(RuntimeError, match="no router's /metrics answered: a: connection refused; b: "):
        obs.observe()


def test_a_sample_follows_the_histogram():
    h = TokenHistogram((1.0, 2.0, 4.0, 8.0, math.inf), (0, 0, 10, 30, 0))
    lengths = h.sample(400, seed=3)
    assert all(2 <= n <= 8 for n in lengths)
    assert 0.6 < sum(n > 4 for n in lengths) / 400 < 0.9
    assert h.sample(400, seed=3) == lengths  # seeded
    assert TokenHistogram((1.0, math.inf), (0, 0)).sample(5) == []


@pytest.fixture(scope="module")
def router_endpoint():
    m = RouterMetrics()
    complete(m, 700, 70, n=4)
    server = serve_metrics("127.0.0.1:0", m.registry, pki.security("router", "router"))
    yield server
    server.close()


def test_the_monitor_certificate_reads_a_real_routers_metrics_and_a_clients_does_not(router_endpoint):
    clock = Clock()
    obs = Observer(lambda: [router_endpoint.url], pki.security("monitor", "autoscaler").client_ssl(), 60,
                   clock=clock)
    with pytest.raises(RuntimeError, match="first reading"):
        obs.observe()
    assert parse_reading(scrape(router_endpoint.url, pki.security("monitor", "autoscaler").client_ssl()), 0).count == 4
    refused = Observer(lambda: [router_endpoint.url], pki.security("client", "acme").client_ssl(), 60, clock=clock)
    with pytest.raises(RuntimeError, match="403"):
        refused.observe()
