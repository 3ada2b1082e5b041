"""The metric catalog (runtime/telemetry/catalog.py): the doc table lists exactly what
the code exports, every family has its HELP, events move exactly the counters they
name, and a histogram observed inside a recording span carries its trace id."""

from __future__ import annotations

import re

from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from runtime.telemetry import metrics as transport_metrics
from runtime.telemetry.catalog import (
    DirectoryMetrics,
    RouterMetrics,
    WorkerMetrics,
    prompt_bucket,
    trace_exemplar,
)
from tests.support import REPO
from tests.support.metrics import Scrape

DOC = REPO / "docs" / "observability.md"


def doc_tables() -> list[dict[str, str]]:
    """The Metrics section's tables: [{name: type}] (first table: the catalog's, second: the transports')."""
    section = DOC.read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    tables, current = [], None
    for line in section.splitlines():
        m = re.match(r"\| `(\w+)` \| (\w+) \|", line)
        if m:
            if current is None:
                current = {}
                tables.append(current)
            current[m.group(1)] = m.group(2)
        elif not line.startswith("|"):
            current = None
    return tables


def exported(*owners) -> dict[str, str]:
    """{exposed name: type} of the pd_ families of the owners' registries (counters with _total)."""
    out = {}
    for owner in owners:
        for family in owner.registry.collect():
            if family.name.startswith("pd_"):
                out[family.name + ("_total" if family.type == "counter" else "")] = family.type
                assert family.documentation and family.documentation != family.name, family.name
    return out


def test_the_doc_table_lists_exactly_the_catalog():
    catalog, transports = doc_tables()
    assert catalog == exported(RouterMetrics(), WorkerMetrics(), DirectoryMetrics())


def test_the_doc_lists_exactly_the_transports_figures():
    _, transports = doc_tables()
    assert {n.removesuffix("_total") for n in transports} == set(transport_metrics.HELP)
    for name, kind in transports.items():
        assert kind == ("counter" if name.endswith("_total") else "gauge"), name


def test_drain_depth_is_zero_and_rollback_durations_empty_until_a_rollback():
    m = Scrape(generate_latest(RouterMetrics().registry).decode())
    assert m.value("pd_drain_depth") == 0
    assert not m.samples("pd_rollback_duration_seconds_count")  # labelled by step: no series yet


def test_routes_and_attempts_move_exactly_their_counters():
    r = RouterMetrics()
    r.dispatched(1, "disaggregated", "disaggregated", None)
    r.attempt_failed("disaggregated", "DEADLINE_EXCEEDED")
    r.dispatched(2, "disaggregated", "disaggregated", "prefill")
    r.attempt_failed("disaggregated", "UNAVAILABLE")
    r.dispatched(3, "colocated", "disaggregated", "decode reserve")
    r.dispatched(1, "colocated", "disaggregated", None)  # another request: no pair at placement
    r.dispatched(1, "colocated", "colocated", None)  # asked colocated: no fallback
    r.ended("disaggregated", "colocated", "ok")
    r.ended("auto", "none", "rejected")
    m = Scrape(generate_latest(r.registry).decode())
    assert m.value("pd_kv_transfer_attempts_total") == 2
    assert m.value("pd_kv_transfer_retries_total") == 1
    assert m.value("pd_kv_transfer_timeouts_total") == 1
    assert m.value("pd_kv_transfer_failures_total") == 2
    assert m.value("pd_kv_transfer_failures_total", code="UNAVAILABLE") == 1
    assert m.value("pd_fallbacks_total", reason="retry") == 1
    assert m.value("pd_fallbacks_total", reason="placement") == 1
    assert m.value("pd_reroutes_total") == 2
    assert m.value("pd_recomputes_total") == 1  # only after the attempt that reached prefill
    assert m.value("pd_route_total", policy="disaggregated", topology="colocated", result="ok") == 1
    assert m.value("pd_route_total", policy="auto", topology="none", result="rejected") == 1


def test_completions_fill_the_cells_histograms_and_the_slo_verdicts():
    r = RouterMetrics()
    r.completed("gold", 100, ttft_s=0.2, tpot_s=0.01, num_tokens=8, slo_ttft_s=0.3, slo_tpot_s=0.02)
    r.completed("gold", 100, ttft_s=0.4, tpot_s=0.01, num_tokens=8, slo_ttft_s=0.3, slo_tpot_s=0.02)
    r.completed("gold", 600, ttft_s=0.1, tpot_s=0.0, num_tokens=1, slo_ttft_s=0.0, slo_tpot_s=0.0)
    m = Scrape(generate_latest(r.registry).decode())
    assert m.value("pd_ttft_seconds_count", tenant="gold", prompt_bucket="le128") == 2
    assert m.value("pd_ttft_seconds_count", tenant="gold", prompt_bucket="le2048") == 1
    assert m.value("pd_tpot_seconds_count") == 2  # one token: no TPOT
    assert m.value("pd_slo_requests_total", attained="yes") == 1
    assert m.value("pd_slo_requests_total", attained="no") == 1  # no target: no verdict


def test_prompt_buckets():
    assert [prompt_bucket(n) for n in (1, 128, 129, 8192, 8193)] == ["le128", "le128", "le512", "le8192", "gt8192"]


def test_worker_events_and_denials():
    w = WorkerMetrics()
    w.sent(4096, 0.003)
    w.received(4096)
    w.denied("nonce")
    w.denied("nonce")
    m = Scrape(generate_latest(w.registry).decode())
    assert m.value("pd_kv_transfer_bytes_total", direction="sent") == 4096
    assert m.value("pd_kv_transfer_bytes_total", direction="received") == 4096
    assert m.value("pd_kv_exposed_transfer_seconds_count") == 1
    assert m.value("pd_capability_denials_total", reason="nonce") == 2


def test_publication_rejects_by_reason_and_applied_ones_not_counted():
    d = DirectoryMetrics()
    for name in ("APPLIED", "STALE_GENERATION", "DUPLICATE", "CHECKSUM_CONFLICT", "STALE_GENERATION"):
        d.publication(name)
    m = Scrape(generate_latest(d.registry).decode())
    assert {s.labels["reason"]: s.value for s in m.samples("pd_publication_rejects_total")} == \
        {"stale": 2, "duplicate": 1, "digest": 1}


def test_a_histogram_observed_in_a_span_carries_its_trace_id_and_none_without():
    w = WorkerMetrics()
    assert trace_exemplar() is None  # no span: tracing off
    w.sent(10, 0.5)
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("prefill") as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
        w.sent(10, 0.004)
    m = Scrape(openmetrics_latest(w.registry).decode(), openmetrics=True)
    exemplars = [s.exemplar for s in m.samples("pd_kv_exposed_transfer_seconds_bucket") if s.exemplar]
    assert [e.labels for e in exemplars] == [{"trace_id": trace_id}]
    assert exemplars[0].value == 0.004


def _touched() -> tuple[RouterMetrics, WorkerMetrics, DirectoryMetrics]:
    """One of each catalog with every counter and histogram family holding a labelled child."""
    r, w, d = RouterMetrics(), WorkerMetrics(), DirectoryMetrics()
    r.dispatched(1, "disaggregated", "disaggregated", None)
    r.attempt_failed("disaggregated", "DEADLINE_EXCEEDED")
    r.completed("gold", 100, ttft_s=0.2, tpot_s=0.01, num_tokens=8, slo_ttft_s=0.3, slo_tpot_s=0.0)
    r.queued("gold", 100, 0.01)
    r.finished("gold", 100, 0.3)
    r.ended("disaggregated", "disaggregated", "ok")
    w.sent(10, 0.001)
    w.denied("nonce")
    d.publication("DUPLICATE")
    return r, w, d


def test_counters_and_histograms_have_no_created_series_in_either_format():
    for owner in _touched():
        for text, openmetrics in ((generate_latest(owner.registry).decode(), False),
                                  (openmetrics_latest(owner.registry).decode(), True)):
            names = {name for name, _ in Scrape(text, openmetrics).as_dict()}
            assert any(n.startswith("pd_") for n in names)
            assert not [n for n in names if n.endswith("_created")], owner
            assert "_created" not in text


def test_completions_count_prompt_and_generated_tokens_by_tenant():
    r = RouterMetrics()
    r.completed("gold", 100, ttft_s=0.2, tpot_s=0.01, num_tokens=8, slo_ttft_s=0.0, slo_tpot_s=0.0)
    r.completed("gold", 30, ttft_s=0.1, tpot_s=0.0, num_tokens=1, slo_ttft_s=0.0, slo_tpot_s=0.0)
    r.completed("iron", 7, ttft_s=0.1, tpot_s=0.01, num_tokens=3, slo_ttft_s=0.0, slo_tpot_s=0.0)
    m = Scrape(generate_latest(r.registry).decode())
    assert m.value("pd_prompt_tokens_total", tenant="gold") == 130
    assert m.value("pd_generation_tokens_total", tenant="gold") == 9
    assert m.value("pd_prompt_tokens_total", tenant="iron") == 7
    assert m.value("pd_generation_tokens_total", tenant="iron") == 3


def test_queue_time_and_end_to_end_latency_fill_their_cells():
    r = RouterMetrics()
    r.queued("gold", 100, 0.004)
    r.queued("gold", 600, 0.7)
    r.finished("gold", 100, 1.5)
    m = Scrape(generate_latest(r.registry).decode())
    assert m.value("pd_request_queue_time_seconds_count", tenant="gold", prompt_bucket="le128") == 1
    assert m.value("pd_request_queue_time_seconds_count", prompt_bucket="le2048") == 1
    assert m.value("pd_request_queue_time_seconds_sum") == 0.704
    assert m.value("pd_request_queue_time_seconds_bucket", le="0.005") == 1  # only the short wait
    assert m.value("pd_e2e_request_latency_seconds_count", tenant="gold", prompt_bucket="le128") == 1
    assert m.value("pd_e2e_request_latency_seconds_bucket", le="1.0") == 0
    assert m.value("pd_e2e_request_latency_seconds_bucket", le="2.5") == 1


def test_kv_cache_usage_is_the_held_share_of_the_pool_read_at_each_scrape():
    w = WorkerMetrics()
    pool = {"free": 96, "total": 128}
    w.bind(lambda: pool["free"], lambda: 0, lambda: pool["total"], lambda: 0, lambda: 0)
    assert Scrape(generate_latest(w.registry).decode()).value("pd_kv_cache_usage_ratio") == 0.25
    pool["free"] = 128  # everything back (cached prefix blocks count as free)
    assert Scrape(generate_latest(w.registry).decode()).value("pd_kv_cache_usage_ratio") == 0.0
    pool["total"] = 0  # no pool yet: 0, not a division by zero
    assert Scrape(generate_latest(w.registry).decode()).value("pd_kv_cache_usage_ratio") == 0.0
